"""The operator page: `/ui` and its data (`/admin/ui/state`)."""
