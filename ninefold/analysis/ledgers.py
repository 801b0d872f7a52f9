"""The nine time ledgers, in precedence order of their families (see the project's LEDGERS contract).

This is where they are declared, with their order; code that picks one ledger out names it by this spelling."""

LEDGERS = ("compute", "recompute", "host", "exposed_comm", "memcpy", "io", "bubble", "straggler", "idle")
LEDGER_ID = {name: i for i, name in enumerate(LEDGERS)}

DESCRIPTIONS = {
    "compute": "a compute kernel is running on some stream",
    "recompute": "the running compute kernels are forward ops re-executed in backward (activation checkpointing)",
    "host": "the GPU has nothing queued because the host has not launched the next work yet",
    "exposed_comm": "a communication kernel moves bytes with no compute overlapping it",
    "memcpy": "a copy or memset runs with neither compute nor communication overlapping it",
    "io": "the GPU is idle while the host is in data loading or storage I/O",
    "bubble": "a pipeline stage waits for a neighbour stage",
    "straggler": "inside a collective, before the last member of the group arrived",
    "idle": "the GPU is idle and nothing above explains it",
}


def totals(con, job: str) -> list[tuple[int, int, str, int]]:
    """JOB's stored ledger totals as (rank, step, ledger, ns), by rank, step and the ledgers' order here: what
    ``ninefold ledgers`` prints and ``Store.ledgers`` returns."""
    rows = con.execute("SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = ?", [job]).fetchall()
    return sorted(rows, key=lambda r: (r[0], r[1], LEDGER_ID[r[2]]))
