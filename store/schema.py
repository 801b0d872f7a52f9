"""Every table, declared once. Times are BIGINT nanoseconds, absolute (Unix epoch)."""

TABLES: dict[str, str] = {
    "jobs": """
        job VARCHAR PRIMARY KEY,
        created_at TIMESTAMP DEFAULT current_timestamp,
        world_size INTEGER
    """,
    "traces": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        path VARCHAR NOT NULL,
        sha256 VARCHAR NOT NULL,
        format VARCHAR NOT NULL,          -- kineto
        schema_version VARCHAR,
        world_size INTEGER,
        device_name VARCHAR,
        base_ns BIGINT,                   -- baseTimeNanoseconds, 0 when absolute
        time_mode VARCHAR,                -- relative_base | absolute_us | relative_unknown
        backend VARCHAR,
        nccl_version VARCHAR,
        pg_config JSON,
        n_events BIGINT,
        salvaged BOOLEAN DEFAULT false,
        ingested_at TIMESTAMP DEFAULT current_timestamp,
        PRIMARY KEY (job, rank)
    """,
    "gpu_ops": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        device INTEGER,
        stream BIGINT,
        kind VARCHAR NOT NULL,            -- kernel | memcpy | memset | sync
        name VARCHAR,
        start_ns BIGINT NOT NULL,
        end_ns BIGINT NOT NULL,
        correlation BIGINT,
        external_id BIGINT,
        copy_kind VARCHAR,                -- HtoD, DtoH, DtoD, PtoP ... for memcpy
        bytes BIGINT,
        args JSON
    """,
    "host_ops": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        pid VARCHAR,
        tid VARCHAR,
        cat VARCHAR,                      -- normalised lower case: cpu_op, user_annotation, cuda_runtime ...
        name VARCHAR,
        start_ns BIGINT NOT NULL,
        end_ns BIGINT NOT NULL,
        external_id BIGINT,
        correlation BIGINT,
        depth INTEGER,                    -- nesting depth on its thread, 0 = outermost
        args JSON
    """,
    "collectives": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        pg_name VARCHAR,
        pg_desc VARCHAR,
        pg_ranks VARCHAR,
        seq BIGINT,
        coll VARCHAR,
        in_nelems BIGINT,
        out_nelems BIGINT,
        dtype VARCHAR,
        bytes BIGINT,
        group_size INTEGER,
        start_ns BIGINT,                  -- the GPU kernel when there is one, else the CPU op
        end_ns BIGINT,
        kernel_name VARCHAR,
        external_id BIGINT,
        source VARCHAR                    -- kernel | cpu_op
    """,
    "steps": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        step INTEGER NOT NULL,
        start_ns BIGINT NOT NULL,
        end_ns BIGINT NOT NULL
    """,
    "flows": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        cat VARCHAR,
        id BIGINT,
        ph VARCHAR,
        ts_ns BIGINT
    """,
    "diagnostics": """
        job VARCHAR,
        rank INTEGER,
        source VARCHAR,
        code VARCHAR,
        count BIGINT,
        example VARCHAR
    """,
}

# Tables whose rows belong to one (job, rank) trace; replaced together.
PER_TRACE = ["gpu_ops", "host_ops", "collectives", "steps", "flows", "diagnostics"]


def create_all(con) -> None:
    for name, cols in TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {name} ({cols})")
