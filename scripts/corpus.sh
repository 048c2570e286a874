#!/usr/bin/env bash
# Write a new version of the reference corpus (corpus/VERSION): signed runs of the
# project's own examples, DVC-tracked, their data pushed into corpus/remote, the DVC remote
# that ships inside the repository. Every later version of kronos-audit must still verify,
# restore and replay them (tests/test_corpus.py; `kaudit gate` here).
#
#     KAUDIT_HOME=~/corpus-home bash scripts/corpus.sh v2
#
# Run it from a clean work tree at the commit whose code writes the corpus (the manifests
# record that commit, and replays check it out), with the project's corpus key
# (kronos-audit-corpus) in KAUDIT_HOME: its public half is in .kaudit/trusted-keys/. Then
# add the new version to [gate] runs in .kaudit/config.toml and commit corpus/. A version
# already written is never rewritten: a format change adds a version and keeps the old.
set -euo pipefail
VERSION="${1:?usage: scripts/corpus.sh VERSION (v1, v2 ...)}"
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
OUT="corpus/$VERSION"
[ ! -e "$OUT" ] || { echo "corpus: $OUT exists: a corpus version is written once" >&2; exit 2; }
[ -z "$(git status --porcelain)" ] || { echo "corpus: the work tree is not clean" >&2; exit 2; }
export KAUDIT_KEY=kronos-audit-corpus
if [ "$(id -u)" -eq 0 ]; then  # Open MPI refuses root unless told (a container's root)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# 1. one process: the heat equation, two checkpoints
python examples/heat/run.py --steps 40 --n 16 --every 20 --root "$OUT" --run-id heat
# 2. several ranks: the same on 2 MPI ranks, one sharded step each checkpoint
mpiexec --oversubscribe -n 2 python examples/heat_mpi/run.py --steps 40 --n 16 --every 20 \
    --root "$OUT" --run-id heat-mpi
# 3. a PyTorch state: model, optimizer, scheduler and torch's generator
python examples/torch_train/run.py --steps 20 --every 10 --batch 16 --hidden 16 \
    --root "$OUT" --run-id torch-train
# 4. a Monte Carlo ledger, and the campaign's completeness certificate
python examples/montecarlo/run.py --batches 8 --samples 2000 --engine processes --workers 2 \
    --root "$OUT" --run-id pi
# 5. a replay attestation of the heat run's last segment
kaudit replay "$OUT/heat/step-00000040.h5.kaudit.json" --attest
kaudit push "$OUT"
kaudit verify "$OUT"
du -sh corpus
echo "corpus: $OUT written; add it to [gate] runs in .kaudit/config.toml and commit corpus/"
