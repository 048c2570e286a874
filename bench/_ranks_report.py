"""The tables and goals bench/bench_ranks.py prints from its launches' figures."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

from bench._common import MPI_YIELD
from bench._ranks_worker import COLS, DISK, NODE_LOCAL, RAW_REPEATS, SHM, Launch, Params, rows

WEAK_GOAL = 1.2
"""The target: a commit on N ranks costs at most this times the single-rank commit of the
same per-rank bytes, judged here as (kaudit / peer on N) / (kaudit / peer on one rank)."""
MD5_TARGET = 1.5
"""The sync durable commit of the global state, on any rank count, against one md5 pass."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity), which the ranks share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def ms(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def per_rank(values: list[float], fmt: Callable[[float], str]) -> str:
    return "/".join(fmt(v) for v in values)


def cpu_s(seconds: float) -> str:
    return f"{seconds:.3f}"


def mib(n: float) -> str:
    return f"{n / 2**20:.0f}"


def report_weak(
    p: Params, pairs: dict[tuple[str, int], tuple[Launch, Launch]], table: list[dict[str, Any]]
) -> list[tuple[str, bool | None]]:
    """Print the weak-scaling figures against the peer, and their goals; add them to the
    table's rows; return each goal and whether it passed (None: not judged)."""
    cores = usable_cores()
    print(
        "\nweak scaling against the peer: K ranks' sync commit against K processes doing "
        "the same job without kaudit\n(the peer, each rank in the same launch: write+fsync "
        "its strip, around the page cache where the\nfile system allows, as kaudit does, "
        "while two threads hash it, sha256 twice and md5), beside\nthe same ratio on one "
        f"rank of the same per-rank bytes (its own launch); weak = x peer on K / x peer on 1,"
        f"\nthe target at most {WEAK_GOAL}x; plain = kaudit on K / kaudit on 1 (the "
        "machine's shared disk and cores\nincluded); peer K/1: what the machine costs any "
        "K writers of these bytes"
    )
    header = "fs|ranks|MiB/rank|kaudit K|peer K|x peer|kaudit 1|peer 1|x peer|weak|plain|peer K/1"
    widths = [7, 7, 10, 10, 10, 8, 10, 10, 8, 8, 8, 10]
    print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
    rows = {row["ranks"]: row for row in table}
    goals: list[tuple[str, bool | None]] = []
    for (fs, k), (many, one) in sorted(pairs.items()):
        kaudit_k, peer_k = statistics.median(many.durable[1:]), statistics.median(many.peer)
        kaudit_1, peer_1 = statistics.median(one.durable[1:]), statistics.median(one.peer)
        x_k, x_1 = kaudit_k / peer_k, kaudit_1 / peer_1
        weak = x_k / x_1
        rows[k][f"weak_{fs}"] = weak
        rows[k][f"x_peer_{fs}"] = (x_k, x_1)
        cells = (
            fs,
            f"{k} r",  # not a bare number first: the first table's rows are the ones that are
            f"{p.mib / k:g}",
            ms(kaudit_k),
            ms(peer_k),
            f"{x_k:.2f}x",
            ms(kaudit_1),
            ms(peer_1),
            f"{x_1:.2f}x",
            f"{weak:.2f}x",
            f"{kaudit_k / kaudit_1:.2f}x",
            f"{peer_k / peer_1:.2f}x",
        )
        print("".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
        text = (
            f"weak scaling, {k} ranks, {fs}, {p.mib / k:g} MiB a rank: (kaudit / peer on {k}) / "
            f"(kaudit / peer on 1) <= {WEAK_GOAL}x ({x_k:.2f}x / {x_1:.2f}x = {weak:.2f}x)"
        )
        goals.append((text, None if k > cores else weak <= WEAK_GOAL))
    directs = {fs: many.peer_direct and one.peer_direct for (fs, _), (many, one) in pairs.items()}
    print(
        "the peer's writes (a tmpfs file is memory either way) "
        + "; ".join(
            f"on {fs} {'were' if d else 'were not'} O_DIRECT, as kaudit's"
            for fs, d in sorted(directs.items())
        )
    )
    print(
        "\nper rank (rank 0 first, '/' between ranks): CPU seconds of one commit (kaudit: a "
        "checkpoint taken, median;\npeer: one run of its job, median) and the largest growth "
        "of the resident memory over one call\n(VmHWM, reset at its start), in MiB; x peer: "
        "kaudit's CPU summed over the ranks against the\npeer's; weak: x peer on K / x peer "
        "on 1 (the "
        "CPU the protocol adds per rank added; a rank waiting in a collective busy-polls, "
        "which counts)"
    )
    header = "fs|ranks|MiB/rank|kaudit CPU s|+RSS MiB|peer CPU s|+RSS MiB|x peer|weak"
    widths = [7, 7, 10, 26, 14, 26, 14, 8, 8]
    print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
    for (fs, k), (many, one) in sorted(pairs.items()):
        x_cpu = {n.ranks: sum(n.cpu) / sum(n.peer_cpu) for n in (one, many)}
        rows[k][f"cpu_weak_{fs}"] = x_cpu[k] / x_cpu[1]
        for launch_ in (one, many):
            use_cells = (
                fs,
                f"{launch_.ranks} r",
                f"{p.mib / k:g}",
                per_rank(launch_.cpu, cpu_s),
                per_rank([float(n) for n in launch_.rss], mib),
                per_rank(launch_.peer_cpu, cpu_s),
                per_rank([float(n) for n in launch_.peer_rss], mib),
                f"{x_cpu[launch_.ranks]:.2f}x",
                f"{x_cpu[k] / x_cpu[1]:.2f}x" if launch_ is many else "",
            )
            print("".join(c.rjust(w) for c, w in zip(use_cells, widths, strict=True)))
    return goals


def report(
    p: Params,
    raws: list[float],
    hashed: float,
    md5: float,
    results: list[Launch],
    copied: list[float],
    alone: dict[int, Launch],
    pairs: dict[tuple[str, int], tuple[Launch, Launch]],
    load: tuple[float, float],
) -> list[dict[str, Any]]:
    """Print the tables; return one row per rank count."""
    raw = statistics.median(raws)
    by = {(r.ranks, r.mode): r for r in results}
    print(
        f"global state {p.mib:g} MiB float64 ({rows(p)} x {COLS}, ka.Block(axis=0) strips), "
        f"{p.checkpoints} checkpoints per launch, medians of all but the first; "
        f"{usable_cores()} cores, load average {load[0]:.1f} at the start, {load[1]:.1f} at "
        "the end"
    )
    print(
        f"baseline: one process writing+fsyncing the {p.mib:g} MiB to one file "
        f"{ms(raw)} (median of {len(raws)}, {RAW_REPEATS} before each launch); for reference, "
        f"sha256 then md5 of those bytes on one core {ms(hashed)} ({hashed / raw:.2f}x raw);\n"
        f"one md5 pass over them in memory {ms(md5)} ({md5 / raw:.2f}x raw)"
    )
    header = "ranks|raw K-way|x raw|sync durable|x raw|async durable|x raw|stall|copyto|x copyto"
    header += "|1st stall|decide"
    widths = [5, 11, 8, 14, 8, 15, 8, 10, 10, 10, 11, 10]
    print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
    table = []
    for k in sorted({r.ranks for r in results}):
        sync, asyn, push = by[(k, "sync")], by[(k, "async")], by[(k, "push")]
        row = {
            "ranks": k,
            "raw_share": sync.raw_share,
            "sync": statistics.median(sync.durable[1:]),
            "async": statistics.median(asyn.durable[1:]),
            "stall": statistics.median(asyn.stall[1:]),
            "first_stall": asyn.stall[0],
            "decide": statistics.median(asyn.decide),
            "copyto": asyn.copyto,
            "pushed": statistics.median(push.durable[1:]),
            "unpushed": statistics.median(push.unpushed),
        }
        if k in alone:
            row["alone"] = statistics.median(alone[k].durable[1:])
        if (k, NODE_LOCAL) in by:
            row["node_local"] = statistics.median(by[(k, NODE_LOCAL)].durable[1:])
        table.append(row)
        cells = (
            str(k),
            ms(row["raw_share"]),
            f"{row['raw_share'] / raw:.2f}x",
            ms(row["sync"]),
            f"{row['sync'] / raw:.2f}x",
            ms(row["async"]),
            f"{row['async'] / raw:.2f}x",
            ms(row["stall"]),
            ms(row["copyto"]),
            f"{row['stall'] / row['copyto']:.2f}x",
            ms(row["first_stall"]),
            ms(row["decide"]),
        )
        print("".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    cores = usable_cores()
    crowded = [k for k in sorted({r.ranks for r in results}) if k > cores]
    print(
        "raw K-way: K processes each writing+fsyncing its 1/K strip at once; sync durable:\n"
        "asynchronous=False, run.checkpoint until the step is committed on every rank;\n"
        "async durable: run.checkpoint + run.wait(); stall: the async loop's time inside\n"
        "run.checkpoint (longest rank); copyto: one np.copyto of a rank's strip (longest rank);\n"
        "1st stall: the first checkpoint's (its staging buffers are new); decide: a call\n"
        "that took no checkpoint, the ranks agreeing on whether to (longest rank)"
    )
    copy = statistics.median(copied)
    print(
        f"\npushed (asynchronous=False, push=True, a local directory DVC remote): until the "
        f"step is committed and every object of it\nconfirmed in the remote, its manifest "
        f"last; baseline: one process copying the {p.mib:g} MiB to another directory "
        f"{ms(copy)}\n(no fsync, as DVC's local remote writes; median of {len(copied)})"
    )
    header = "ranks|unpushed|pushed|x raw|x copy|x unpushed|push part|x copy"
    widths = [8, 12, 12, 8, 8, 12, 12, 8]
    print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
    for row in table:
        part = row["pushed"] - row["unpushed"]
        pushed_cells = (
            # Not a bare number first: the rows of the table above are the ones that are.
            f"{row['ranks']} rank{'s' if row['ranks'] > 1 else ''}",
            ms(row["unpushed"]),
            ms(row["pushed"]),
            f"{row['pushed'] / raw:.2f}x",
            f"{row['pushed'] / copy:.2f}x",
            f"{row['pushed'] / row['unpushed']:.2f}x",
            ms(part),
            f"{part / copy:.2f}x",
        )
        print("".join(c.rjust(w) for c, w in zip(pushed_cells, widths, strict=True)))
    print(
        "unpushed: the same commits without push=True, in the same launch just before and\n"
        "just after (the median of both);\n"
        "push part: pushed minus unpushed, the push's own cost"
    )
    local = [row for row in table if "node_local" in row]
    if local:
        print(
            "\nnode-local (asynchronous=False, push=True, each rank in a clone of its own with "
            "KAUDIT_LOCAL_DIR there):\nuntil the step is committed, which it is only once every "
            "rank's shard is in the remote (the ranks\nshare no directory: the remote is where "
            "the step meets), and its manifest put there last"
        )
        header = "ranks|node-local|x raw|x copy|x pushed"
        widths = [8, 12, 8, 8, 10]
        print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
        for row in local:
            local_cells = (
                f"{row['ranks']} rank{'s' if row['ranks'] > 1 else ''}",
                ms(row["node_local"]),
                f"{row['node_local'] / raw:.2f}x",
                f"{row['node_local'] / copy:.2f}x",
                f"{row['node_local'] / row['pushed']:.2f}x",
            )
            print("".join(c.rjust(w) for c, w in zip(local_cells, widths, strict=True)))
        print("x pushed: against the pushed commit of the same ranks on one shared directory")
    polling = os.environ.get(MPI_YIELD) == "1"
    print(
        "MPI ranks waiting in a collective "
        + ("yield the core (OMPI_MCA_mpi_yield_when_idle=1)" if polling else "busy-poll")
    )
    print(
        f"\nthe sync durable commit against one md5 pass over the same {p.mib:g} MiB "
        f"({ms(md5)}; target at most {MD5_TARGET}x):"
    )
    for row in table:
        ratio = row["sync"] / md5
        row["x_md5"] = ratio
        print(
            f"  {row['ranks']} rank{'s' if row['ranks'] > 1 else ''}: {ms(row['sync'])}, "
            f"{ratio:.2f}x ({'met' if ratio <= MD5_TARGET else 'not met'})"
        )
    weak = [row for row in table if "alone" in row]
    if weak:
        print(
            "\nweak scaling, plain: the sync commit on K ranks against one rank committing "
            "the same per-rank bytes\n(its own launch), the machine's shared disk and cores "
            "included: not the goal's figure, see the peer below"
        )
        for row in weak:
            ratio = row["sync"] / row["alone"]
            row["plain"] = ratio
            print(
                f"  {row['ranks']} ranks, {p.mib / row['ranks']:g} MiB each: "
                f"{ms(row['sync'])} against "
                f"{ms(row['alone'])} on one rank: {ratio:.2f}x"
            )
    if crowded:
        print(
            f"{', '.join(map(str, crowded))} ranks on {cores} cores: oversubscribed "
            "(ranks share cores), so contention is measured as much as scaling"
        )
    goals = report_weak(p, pairs, table) if pairs else []
    if goals:
        print("goals:")
        for text, ok in goals:
            verdict = "PASS" if ok else "MISS" if ok is not None else "NOT JUDGED"
            print(f"  {verdict}  {text}")
        for k in crowded:
            if any(f"weak_{fs}" in row for row in table if row["ranks"] == k for fs in (DISK, SHM)):
                print(
                    f"  ({k} ranks on {cores} cores is oversubscribed: more ranks than cores, "
                    "not judged)"
                )
    return table
