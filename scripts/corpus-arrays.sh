#!/usr/bin/env bash
# Write corpus/arrays: the Monte Carlo example as a Slurm job array of 2 tasks
# (examples/montecarlo/run.py --array), run one after another with the environment Slurm
# gives each task, and the array's completeness certificate (campaign/v3); the tasks'
# checkpoints and the certificate's records pushed into corpus/remote, the DVC remote that
# ships inside the repository. `kaudit gate` replays each task's newest step and verifies
# the certificate (tests/test_corpus.py, from a fresh clone).
#
#     KAUDIT_HOME=~/corpus-home KAUDIT_KEY=kronos-audit-corpus-N bash /path/to/corpus-arrays.sh
#
# Run it with kaudit on PATH, from a clean work tree checked out at a commit of main's
# history whose code writes the corpus: the manifests record that commit, and a replay checks
# it out, on a fresh clone too. A commit of a branch that is rebased before it lands is in no
# clone, so the commit must already be main's (MAIN names another branch to check against).
# The key (KAUDIT_KEY, in KAUDIT_HOME and in your user trust store) is a corpus key: its
# public half in .kaudit/trusted-keys/, its name in [gate] signers, its id pinned in
# tests/test_corpus.py; keep its private half nowhere once the corpus is written. Every
# task runs under `kaudit run --portable`: its CPU kernels pinned, so the gate replays it
# bitwise on any x86-64-v3 CPU.
set -euo pipefail
ROOT="$(git rev-parse --show-toplevel)"
cd "$ROOT"
OUT="corpus/arrays"
[ ! -e "$OUT" ] || { echo "corpus: $OUT exists: remove it in a commit first" >&2; exit 2; }
[ -z "$(git status --porcelain)" ] || { echo "corpus: the work tree is not clean" >&2; exit 2; }
git merge-base --is-ancestor HEAD "${MAIN:-main}" \
    || { echo "corpus: HEAD is not a commit of ${MAIN:-main}: a replay could not check it out" >&2; exit 2; }
export KAUDIT_KEY="${KAUDIT_KEY:?name the corpus key: KAUDIT_KEY=kronos-audit-corpus-N}"
for task in 0 1; do  # as `sbatch --array=0-1` starts them, one after the other
    SLURM_ARRAY_TASK_ID="$task" SLURM_ARRAY_TASK_COUNT=2 \
        kaudit run --portable --retries 0 -- python examples/montecarlo/run.py --array \
        --batches 4 --samples 2000 --root "$OUT" --run-id pi-array
done
kaudit campaign pi-array --root "$OUT" --certify --push
kaudit push "$OUT"
kaudit verify "$OUT"
echo "corpus: $OUT written at $(git rev-parse --short HEAD); commit corpus/ in your branch"
