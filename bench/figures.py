"""The names of the bench's rows and how a figure is read out of the
results, shared by the report (report.py) and its charts (charts.py)."""

FL = "fenced_lock"
FLOOR1 = "floor: 1 durable commit"
PLPGSQL = "PL/pgSQL lease table"
ALWAYS = "Redis, appendfsync always"
ETCD = "etcd v3 Lock/Unlock with a lease"
QUEUE = "fenced_lock_acquire (FIFO queue, asleep)"
PLAIN, NOOP, GUARDED = "UPDATE, unguarded table", "UPDATE, no-op C trigger", "UPDATE, guarded table"


def pick(rows, row, clients=None):
    return next((r for r in rows if r["row"] == row and (clients is None or r["clients"] == clients)), None)


def tps(rows, row, clients=None):
    r = pick(rows, row, clients)
    return r and r["tps"]


def med(costs, server, field):
    s = costs.get(server, {}).get(field)
    return None if s is None else s["median"]
