#!/usr/bin/env bash
# Write a new version of the reference corpus (corpus/VERSION): signed runs of the
# project's own examples, DVC-tracked, their data pushed into corpus/remote, the DVC remote
# that ships inside the repository. Every later version of kronos-audit must still verify,
# restore and replay them (tests/test_corpus.py; `kaudit gate` here).
#
#     KAUDIT_HOME=~/corpus-home KAUDIT_KEY=kronos-audit-corpus-2 bash scripts/corpus.sh v3
#
# Run it from a clean work tree at the commit whose code writes the corpus (the manifests
# record that commit, and replays check it out), with a corpus key in KAUDIT_HOME named by
# KAUDIT_KEY (v1 is signed by kronos-audit-corpus, v2 by kronos-audit-corpus-2): its public
# half in .kaudit/trusted-keys/ and its name in [gate] signers. Then add the new version to
# [gate] runs in .kaudit/config.toml and commit corpus/. A version already written is never
# rewritten: a format change adds a version and keeps the old. Every program runs under
# `kaudit run --portable`: its CPU kernels pinned, so the gate replays it bitwise on any
# x86-64-v3 CPU, Intel or AMD. Run ids end in the version (heat-v2): the DVC remote keeps
# one chain per run id, and a version must never write over another's.
set -euo pipefail
VERSION="${1:?usage: scripts/corpus.sh VERSION (v1, v2 ...)}"
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
OUT="corpus/$VERSION"
[ ! -e "$OUT" ] || { echo "corpus: $OUT exists: a corpus version is written once" >&2; exit 2; }
[ -z "$(git status --porcelain)" ] || { echo "corpus: the work tree is not clean" >&2; exit 2; }
export KAUDIT_KEY="${KAUDIT_KEY:?name the corpus key: KAUDIT_KEY=kronos-audit-corpus-N}"
PORTABLE=(kaudit run --portable --retries 0 --)
if [ "$(id -u)" -eq 0 ]; then  # Open MPI refuses root unless told (a container's root)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# 1. one process: the heat equation, two checkpoints
"${PORTABLE[@]}" python examples/heat/run.py --steps 40 --n 16 --every 20 --root "$OUT" --run-id "heat-$VERSION"
# 2. several ranks: the same on 2 MPI ranks, one sharded step each checkpoint
"${PORTABLE[@]}" mpiexec --oversubscribe -n 2 python examples/heat_mpi/run.py --steps 40 --n 16 --every 20 \
    --root "$OUT" --run-id "heat-mpi-$VERSION"
# 3. a PyTorch state: model, optimizer, scheduler and torch's generator
"${PORTABLE[@]}" python examples/torch_train/run.py --steps 20 --every 10 --batch 16 --hidden 16 \
    --root "$OUT" --run-id "torch-train-$VERSION"
# 4. a Monte Carlo ledger, and the campaign's completeness certificate
"${PORTABLE[@]}" python examples/montecarlo/run.py --batches 8 --samples 2000 --engine processes --workers 2 \
    --root "$OUT" --run-id "pi-$VERSION"
# 5. a replay attestation of the heat run's last segment
kaudit replay "$OUT/heat-$VERSION/step-00000040.h5.kaudit.json" --attest
kaudit push "$OUT"
kaudit verify "$OUT"
du -sh corpus
echo "corpus: $OUT written; add it to [gate] runs in .kaudit/config.toml and commit corpus/"
