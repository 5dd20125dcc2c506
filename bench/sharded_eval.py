"""Evaluation wall time on two data-parallel processes: sharded across the ranks against repeated on each, side by
side in one run.

    OMP_NUM_THREADS=1 python bench/sharded_eval.py [--repeats 3] [--batch-size 16] [--layers 4] [--hidden 256]

Two gloo processes (torch.multiprocessing) build the same tiny random encoder (--layers × --hidden, no download)
with the XNLI fixtures' four languages (150 validation rows each) and time ``mtft.evaluation.evaluate.evaluate``:
  repeated  every rank runs every batch (the behaviour before sharding: ``sharded_map`` swapped for a plain map)
  sharded   each rank runs its round-robin share, ⌈n/2⌉ forward passes an objective, and the rows are all-gathered
alternating A/B so that the machine's load hits both alike. A time is the slowest rank's, between two barriers;
the table gives the median of --repeats. Both modes must return the same metrics and predictions (checked). The
load average is printed beside the ratio: on a shared machine the ratio is only as good as the idle cores.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2
LANGUAGES = ["en", "de", "ar", "zh"]


def config(args):
    from mtft.config import validate_config

    raw = {
        "data": {
            "sources": {
                "facebook/xnli": str(REPO / "tasks/xnli/fixtures/xnli"),
                "nyu-mll/multi_nli": str(REPO / "tasks/xnli/fixtures/multi_nli"),
            },
            "tasks": [{"name": "xnli", "languages": LANGUAGES, "protocol": "in_language", "max_train_examples": 64}],
            "max_length": 64,
        },
        "model": {
            "tiny": {
                "vocab_size": 2000,
                "hidden_size": args.hidden,
                "num_hidden_layers": args.layers,
                "num_attention_heads": 4,
                "intermediate_size": 4 * args.hidden,
            }
        },
    }
    return validate_config(raw, source="bench")


def prepare(args):
    from mtft.data.pipeline import prepare_data
    from mtft.models.tokenizer import tiny_tokenizer

    run = config(args)
    cache = Path(os.environ["MTFT_CACHE"])
    return prepare_data(
        run.data, run.evaluation.split, run.weighting.objectives, lambda texts: tiny_tokenizer(texts, 2000, cache)
    )


def run_rank(rank: int, port: int, args, results) -> None:
    import mtft.evaluation.evaluate as evaluation
    from mtft.data.batching import BatchBuilder
    from mtft.training.setup import build_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    data = prepare(args)  # read from the cache the parent filled
    torch.manual_seed(0)
    model = build_model(config(args), data)
    builder = BatchBuilder(data)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    sharded_map = evaluation.sharded_map
    modes = {"repeated": lambda n, run: [run(i) for i in range(n)], "sharded": sharded_map}
    timings: dict[str, list[float]] = {mode: [] for mode in modes}
    outcome = {}
    try:
        for repeat in range(args.repeats + 1):  # the first round warms up and is not timed
            for mode, mapper in modes.items():
                evaluation.sharded_map = mapper
                torch.distributed.barrier()
                start = time.perf_counter()
                result = evaluation.evaluate(model, data, builder, args.batch_size, "cpu")
                elapsed = torch.tensor([time.perf_counter() - start])
                torch.distributed.all_reduce(elapsed, op=torch.distributed.ReduceOp.MAX)  # the slowest rank's
                if repeat:
                    timings[mode].append(float(elapsed))
                outcome[mode] = (result.metrics, result.predictions)
        if rank == 0:
            rows = [len(data.tasks["xnli"].eval[lang]) for lang in LANGUAGES]
            results.put((timings, outcome["repeated"] == outcome["sharded"], rows, os.getloadavg()))
    finally:
        evaluation.sharded_map = sharded_map
        torch.distributed.destroy_process_group()


def rank_rows(num_rows: int, rank: int, batch_size: int) -> int:
    """Rows rank ``rank`` encodes for an objective of ``num_rows`` rows, its padding pass included."""
    from mtft.core.shards import rank_schedule

    batches = -(-num_rows // batch_size)
    return sum(min(batch_size, num_rows - i * batch_size) for i, _ in rank_schedule(batches, rank, WORLD))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ.setdefault("MTFT_CACHE", str(Path(cache) / "mtft"))
        os.environ.setdefault("HF_DATASETS_CACHE", str(Path(cache) / "datasets"))
        prepare(args)  # fills the tokenizer and datasets caches before the ranks read them
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        results = mp.get_context("spawn").SimpleQueue()
        start_load = os.getloadavg()
        mp.spawn(run_rank, args=(port, args, results), nprocs=WORLD, join=True)
        timings, same, rows, end_load = results.get()
    counts = [-(-n // args.batch_size) for n in rows]
    passes = sum(-(-n // WORLD) for n in counts)
    # rows a rank encodes, padding passes included: the slowest rank's share bounds the ratio on idle cores
    sharded_rows = sum(max(rank_rows(n, r, args.batch_size) for r in range(WORLD)) for n in rows)
    print(
        f"\nevaluation on {WORLD} gloo processes, {os.environ.get('OMP_NUM_THREADS', '1')} thread(s) each, "
        f"{os.cpu_count()} cores; tiny encoder {args.layers} × {args.hidden}; XNLI {len(LANGUAGES)} languages × "
        f"{counts} batches of {args.batch_size}; median of {args.repeats} alternating runs\n"
    )
    print("| | repeated on each rank | sharded |")
    print("|---|---:|---:|")
    print(f"| forward passes per rank | {sum(counts)} | {passes} |")
    print(f"| rows encoded by the busiest rank | {sum(rows)} | {sharded_rows} |")
    repeated, sharded = statistics.median(timings["repeated"]), statistics.median(timings["sharded"])
    print(f"| wall time (s) | {repeated:.3f} | {sharded:.3f} |")
    print(f"| sharded ÷ repeated | | {sharded / repeated:.3f} |")
    print(
        f"\nsame metrics and predictions: {same}; load average (1 min) {start_load[0]:.1f} before, "
        f"{end_load[0]:.1f} after (ideal ratio on idle cores, by rows: {sharded_rows / sum(rows):.3f})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
