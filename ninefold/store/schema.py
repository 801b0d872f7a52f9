"""The tables ingest writes, declared once (the tables of later stages are declared beside the stage that writes
them: attribution, critical path, efficiency, the cost model's comparison, the batch catalog and uploads). Times are
BIGINT nanoseconds, absolute (Unix epoch)."""

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
        format VARCHAR NOT NULL,          -- kineto | nsys
        schema_version VARCHAR,
        world_size INTEGER,
        device_name VARCHAR,
        base_ns BIGINT,                   -- baseTimeNanoseconds (nsys: utcEpochNs), 0 when absolute
        time_mode VARCHAR,                -- relative_base | absolute_us | relative_unknown | session_start (nsys)
        backend VARCHAR,
        nccl_version VARCHAR,
        pg_config JSON,
        n_events BIGINT,
        salvaged BOOLEAN DEFAULT false,
        host_name VARCHAR,                -- the trace's host_name metadata: ranks of one host share a clock
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
    "memory_events": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        ts_ns BIGINT NOT NULL,
        device_type INTEGER,              -- c10 DeviceType: 0 CPU, 1 CUDA ...
        device_id INTEGER,
        addr BIGINT,
        bytes BIGINT,                     -- this allocation (+) or free (-)
        total_allocated BIGINT,
        total_reserved BIGINT
    """,
    "diagnostics": """
        job VARCHAR,
        rank INTEGER,
        source VARCHAR,
        code VARCHAR,
        count BIGINT,
        example VARCHAR
    """,
    # ---- NCCL debug logs (NCCL_DEBUG=INFO); file = resolved path of the log, the replace key
    "nccl_log_files": """
        job VARCHAR NOT NULL,
        path VARCHAR NOT NULL,
        sha256 VARCHAR NOT NULL,
        nccl_version VARCHAR,
        n_lines BIGINT,                   -- physical lines
        n_nccl BIGINT,                    -- records with an NCCL prefix (after splitting fused lines)
        n_parsed BIGINT,                  -- records of a kind the parser extracts
        n_colls BIGINT,
        n_warn BIGINT,
        hosts VARCHAR,
        salvaged BOOLEAN DEFAULT false,
        ingested_at TIMESTAMP DEFAULT current_timestamp,
        PRIMARY KEY (job, path)
    """,
    "nccl_comms": """
        job VARCHAR NOT NULL,
        file VARCHAR NOT NULL,
        host VARCHAR,
        pid BIGINT,
        comm VARCHAR,                     -- the comm pointer, per process
        comm_id VARCHAR,                  -- commId/commHash, shared by every rank of the communicator
        rank INTEGER,
        nranks INTEGER,
        device INTEGER,                   -- cudaDev
        nvml_dev INTEGER,
        bus_id VARCHAR,
        nnodes INTEGER,
        local_ranks INTEGER,
        local_rank INTEGER,
        init_func VARCHAR,
        parent VARCHAR,
        status VARCHAR,                   -- COMPLETE | START | partial
        line_no BIGINT
    """,
    "nccl_topology": """
        job VARCHAR NOT NULL,
        file VARCHAR NOT NULL,
        host VARCHAR,
        pid BIGINT,
        device INTEGER,
        rank INTEGER,
        kind VARCHAR,                     -- ring | tree | channel | nvls
        channel INTEGER,
        n_channels INTEGER,
        src_rank INTEGER,
        dst_rank INTEGER,
        up_rank INTEGER,                  -- tree parent
        peers VARCHAR,                    -- ring order / tree children d0/d1/d2 / NVLS heads
        transport VARCHAR,
        direction VARCHAR,
        line_no BIGINT
    """,
    "nccl_colls": """
        job VARCHAR NOT NULL,
        file VARCHAR NOT NULL,
        host VARCHAR,
        pid BIGINT,
        tid BIGINT,
        device INTEGER,
        rank INTEGER,
        comm VARCHAR,
        comm_id VARCHAR,
        coll_index BIGINT,                -- 0-based order of this op on its (host, pid, comm)
        op VARCHAR,                       -- AllReduce, AllGather, Send ...
        op_count BIGINT,                  -- decoded from hex; counts group launches, not ops
        group_index INTEGER,              -- position among the ops sharing (comm, op_count)
        sendbuff VARCHAR,
        recvbuff VARCHAR,
        count BIGINT,                     -- elements
        datatype INTEGER,
        dtype VARCHAR,
        red_op INTEGER,
        reduction VARCHAR,
        root INTEGER,
        nranks INTEGER,
        stream VARCHAR,
        bytes BIGINT,                     -- count x element size
        algorithm VARCHAR,                -- from the TUNING line of the same launch, when logged
        protocol VARCHAR,
        channel_lo INTEGER,
        channel_hi INTEGER,
        n_channels INTEGER,
        truncated BOOLEAN,                -- the line was cut; the missing fields are NULL
        recovered BOOLEAN,                -- reassembled from an interleaved line
        line_no BIGINT
    """,
    "nccl_events": """
        job VARCHAR NOT NULL,
        file VARCHAR NOT NULL,
        host VARCHAR,
        pid BIGINT,
        rank INTEGER,
        level VARCHAR,                    -- WARN | ERROR | watchdog
        origin VARCHAR,                   -- nccl | torch
        location VARCHAR,                 -- file:line that printed it
        message VARCHAR,
        seq BIGINT,                       -- watchdog SeqNum / work id
        op_type VARCHAR,
        timeout_ms BIGINT,
        last_enqueued BIGINT,
        last_completed BIGINT,
        ts VARCHAR,                       -- the line's own time text, when it has one
        line_no BIGINT
    """,
    # which NCCL COLL line a profiler collective came from (nccl_link.link_profiler_collectives)
    "nccl_coll_links": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        pg_name VARCHAR,
        seq BIGINT,
        coll VARCHAR,
        start_ns BIGINT,
        file VARCHAR,
        line_no BIGINT,
        comm VARCHAR,
        op_count BIGINT,
        method VARCHAR,                   -- seq_opcount | order
        algorithm VARCHAR,
        protocol VARCHAR,
        n_channels INTEGER
    """,
    # ---- nccl-tests result tables
    "nccl_tests_runs": """
        job VARCHAR NOT NULL,
        path VARCHAR NOT NULL,
        sha256 VARCHAR NOT NULL,
        block INTEGER NOT NULL,           -- 0-based table index inside the file
        test VARCHAR,                     -- all_reduce_perf ...
        op VARCHAR,
        nranks INTEGER,
        n_gpus INTEGER,                   -- GPUs per process (nGpus)
        min_bytes BIGINT,
        max_bytes BIGINT,
        iters INTEGER,
        n_rows INTEGER,
        avg_busbw_gbs DOUBLE,             -- the file's own "# Avg bus bandwidth" line
        out_of_bounds BIGINT,
        ingested_at TIMESTAMP DEFAULT current_timestamp
    """,
    "nccl_tests_results": """
        job VARCHAR NOT NULL,
        path VARCHAR NOT NULL,
        block INTEGER NOT NULL,
        test VARCHAR,
        op VARCHAR,
        nranks INTEGER,
        size_bytes BIGINT,
        count BIGINT,
        dtype VARCHAR,
        redop VARCHAR,
        root INTEGER,
        placement VARCHAR,                -- out | in
        time_us DOUBLE,
        algbw_gbs DOUBLE,
        busbw_gbs DOUBLE,
        wrong BIGINT                      -- NULL when the run printed N/A
    """,
    # ---- PyTorch Flight Recorder dumps
    "fr_dumps": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        path VARCHAR NOT NULL,
        sha256 VARCHAR NOT NULL,
        format VARCHAR,                   -- pickle | json
        version VARCHAR,
        comm_lib_version VARCHAR,
        n_entries BIGINT,
        ingested_at TIMESTAMP DEFAULT current_timestamp,
        PRIMARY KEY (job, rank)
    """,
    "fr_pgs": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        pg_id BIGINT,
        pg_name VARCHAR,
        pg_desc VARCHAR,
        ranks VARCHAR,                    -- as written (a string)
        member_ranks INTEGER[],           -- parsed from it; NULL when empty or unreadable
        last_enqueued BIGINT,
        last_started BIGINT,
        last_completed BIGINT
    """,
    "fr_entries": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        record_id BIGINT,
        pg_id BIGINT,
        pg_name VARCHAR,
        pg_desc VARCHAR,
        seq BIGINT,                       -- collective_seq_id
        p2p_seq BIGINT,
        op_id BIGINT,
        op VARCHAR,                       -- profiling_name, e.g. nccl:all_reduce
        is_p2p BOOLEAN,
        state VARCHAR,                    -- scheduled | started | completed
        time_created_ns BIGINT,
        time_started_ns BIGINT,           -- time_discovered_started_ns (an upper bound)
        time_completed_ns BIGINT,         -- time_discovered_completed_ns (an upper bound)
        duration_ms DOUBLE,
        retired BOOLEAN,
        timeout_ms BIGINT,
        in_bytes BIGINT,
        out_bytes BIGINT,
        sizes JSON,                       -- {"input_sizes", "input_dtypes", "output_sizes", "output_dtypes"}
        thread_name VARCHAR,
        top_frame VARCHAR
    """,
    # ---- cost model (ninefold.analysis.cost_model): predicted ledgers per rank and step, predicted memory per rank
    "predicted_ledgers": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        step INTEGER NOT NULL,            -- the measured step it is compared with; -1 when none
        ledger VARCHAR NOT NULL,
        ns BIGINT NOT NULL,
        config_sha VARCHAR NOT NULL
    """,  # the prediction the trace can contain (what is compared); every part, excluded ones too: predicted_parts
    "predicted_parts": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        step INTEGER NOT NULL,            -- as in predicted_ledgers
        ledger VARCHAR NOT NULL,
        ns BIGINT NOT NULL,
        config_sha VARCHAR NOT NULL,
        in_trace BOOLEAN NOT NULL,        -- false: a component the trace cannot contain (shown, not compared)
        reason VARCHAR,                   -- why it is not in the trace; NULL when in_trace
        calibrated_from VARCHAR           -- what the ledger's inputs were calibrated from
    """,
    "predicted_memory": """
        job VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        item VARCHAR NOT NULL,            -- params | grads | optimizer | activations | pipeline_buffers
        bytes DOUBLE NOT NULL
    """,
    # the terms each predicted ledger is made of (ninefold.analysis.cost_model.explain), for the dashboards' residuals
    "predicted_terms": """
        job VARCHAR NOT NULL,
        config_sha VARCHAR NOT NULL,
        ledger VARCHAR NOT NULL,
        seq INTEGER NOT NULL,             -- the term's place in the ledger's explanation
        term VARCHAR NOT NULL,
        value DOUBLE NOT NULL,
        unit VARCHAR NOT NULL,
        source VARCHAR NOT NULL
    """,
}

# Tables whose rows belong to one (job, rank) trace; replaced together.
PER_TRACE = ["gpu_ops", "host_ops", "collectives", "steps", "flows", "memory_events", "diagnostics"]


def create_all(con) -> None:
    for name, cols in TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {name} ({cols})")
    # columns added since a store was first written
    con.execute("ALTER TABLE traces ADD COLUMN IF NOT EXISTS host_name VARCHAR")
