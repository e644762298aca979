"""Pure routing logic: prompt -> block chain, prefix index, load view, cost model, policies.

Nothing here speaks HTTP: the same code runs in the gateway and in the cluster simulator.
"""
