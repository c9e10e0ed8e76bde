"""Serving: the one owner of a request (resolve, plan or whole, device slots, batching,
memory budget, work and energy)."""
