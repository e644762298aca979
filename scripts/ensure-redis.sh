#!/usr/bin/env bash
# Starts a throwaway Redis when none answers on REDIS_URL (tests need a real one).
set -euo pipefail
url="${REDIS_URL:-redis://127.0.0.1:6379}"
hostport="${url#redis://}"; hostport="${hostport%%/*}"
host="${hostport%%:*}"; port="${hostport##*:}"
if redis-cli -h "$host" -p "$port" ping >/dev/null 2>&1; then
  echo "redis answers on $host:$port"
  exit 0
fi
if ! command -v redis-server >/dev/null; then
  echo "no Redis on $host:$port and redis-server is not installed (apt-get install redis-server)" >&2
  exit 1
fi
redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no
for _ in $(seq 50); do
  redis-cli -h "$host" -p "$port" ping >/dev/null 2>&1 && { echo "started redis on $port"; exit 0; }
  sleep 0.1
done
echo "redis did not come up on $port" >&2
exit 1
