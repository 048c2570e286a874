#!/usr/bin/env bash
# Install everything into .venv, then run the kronos-audit demo end to end in a scratch
# project (a new git repository under $TMPDIR), leaving your own keys alone.
source "$(dirname "$0")/bootstrap.sh"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kaudit-demo-XXXXXX")"
export KAUDIT_HOME="$WORK/home"     # the demo's own key directory
export GIT_AUTHOR_NAME="${GIT_AUTHOR_NAME:-kaudit demo}" GIT_AUTHOR_EMAIL="${GIT_AUTHOR_EMAIL:-demo@example.com}"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"
# Narration is printed as "# ..."; a "$ ..." line is always exactly the command that runs.
say() { printf '\n\033[1m# %s\033[0m\n' "$*"; }
show() {  # print "$ COMMAND", quoting arguments with spaces
    local shown="" a
    for a in "$@"; do [[ "$a" =~ [[:space:]] ]] && shown+="'$a' " || shown+="$a "; done
    printf '\033[1m$ %s\033[0m\n' "${shown% }"
}
run() { show "$@"; "$@"; }
expect() {  # expect STATUS COMMAND...: show it, run it, and check its exit status
    local want=$1 status=0
    shift
    show "$@"
    "$@" || status=$?
    echo "exit status: $status"
    [ "$status" -eq "$want" ] || { echo "demo: expected exit $want from: $*" >&2; exit 1; }
}

mkdir "$WORK/project" && cd "$WORK/project"
git init -q -b main
cp "$ROOT/examples/quickstart/make_checkpoint.py" .
git add . && git commit -q -m "solver"

run kaudit init
run kaudit keys generate --name demo
git add -A && git commit -q -m "kaudit init, trust the demo key"

mkdir -p checkpoints/diffusion
run python make_checkpoint.py checkpoints/diffusion/step-100.h5 --steps 100 --seed 42
run kaudit snapshot checkpoints/diffusion/step-100.h5 --run diffusion --step 100 --seed 42 \
    --command "python make_checkpoint.py checkpoints/diffusion/step-100.h5 --steps 100 --seed 42"
run python make_checkpoint.py checkpoints/diffusion/step-200.h5 --steps 200 --seed 42
run kaudit snapshot checkpoints/diffusion/step-200.h5 --run diffusion --step 200 --seed 42 \
    --parent checkpoints/diffusion/step-100.h5.kaudit.json \
    --command "python make_checkpoint.py checkpoints/diffusion/step-200.h5 --steps 200 --seed 42"
run kaudit show checkpoints/diffusion/step-200.h5.kaudit.json
run kaudit verify checkpoints/diffusion

say "flip one byte of the field's data, as a bad disk or a forger would"
python - <<'PY'
import h5py
with h5py.File("checkpoints/diffusion/step-200.h5", "r") as f:
    offset = f["fields/u"].id.get_offset()
with open("checkpoints/diffusion/step-200.h5", "r+b") as f:
    f.seek(offset + 8)
    b = f.read(1)
    f.seek(offset + 8)
    f.write(bytes([b[0] ^ 0x01]))
PY
say "verify must now fail, exit 1, naming what changed"
expect 1 kaudit verify checkpoints/diffusion

say "another tool's checkpoint directory (as torch DCP writes one) signed as one step, from beside it"
mkdir -p checkpoints/dcp/step-100
printf 'tensor map\n' > checkpoints/dcp/step-100/.metadata
head -c 4096 /dev/urandom > checkpoints/dcp/step-100/__0_0.distcp
run kaudit snapshot checkpoints/dcp/step-100 --run dcp --step 100
run cat checkpoints/dcp/step-100.dvc
run kaudit verify checkpoints/dcp/step-100
say "a file added and one changed inside it: verify names each, exit 1"
printf 'stray\n' > checkpoints/dcp/step-100/notes.txt
rm checkpoints/dcp/step-100/.metadata  # a new file, as a tool that writes anew does
printf 'other tensor map\n' > checkpoints/dcp/step-100/.metadata
expect 1 kaudit verify checkpoints/dcp/step-100

say "a solver's restart file, rewritten in place every few steps and signed after each rewrite"
mkdir -p checkpoints/solver
for step in 10 20 30; do
    python - "$step" <<'PY'
import sys

import h5py
import numpy as np

with h5py.File("checkpoints/solver/restart.h5", "w") as f:  # the same name, in place
    f["u"] = np.full((64, 64), float(sys.argv[1]))
PY
    run kaudit snapshot checkpoints/solver/restart.h5 --run rolling --step "$step"
done
say "every step kept beside it, each with its manifest, chained; the solver's file stays its own"
run ls checkpoints/solver/rolling
run kaudit verify checkpoints/solver

say "a long run that survives a fault: kill -9 the solver mid-run, kaudit run restarts it"
cp "$ROOT/examples/heat/run.py" heat.py
git add heat.py && git commit -q -m "heat solver"
show kaudit run --retries 3 --backoff 0 -- python heat.py --steps 3000 --every 200
kaudit run --retries 3 --backoff 0 -- python heat.py --steps 3000 --every 200 > heat.out &
supervisor=$!
until ls checkpoints/heat/step-*.h5.kaudit.json >/dev/null 2>&1; do sleep 0.05; done
sleep 0.3
solver=$(pgrep -P "$supervisor" -f heat.py | head -n 1)
say "kill the solver (pid $solver) in the middle of its run"
run kill -9 "$solver"
wait "$supervisor"
cat heat.out
run kaudit verify checkpoints/heat
say "the same run, never killed"
show python heat.py --steps 3000 --every 200 --run-id heat-uninterrupted
python heat.py --steps 3000 --every 200 --run-id heat-uninterrupted > reference.out
echo "killed and resumed: $(tail -n 1 heat.out)"
echo "never interrupted:  $(tail -n 1 reference.out)"
[ "$(tail -n 1 heat.out)" = "$(tail -n 1 reference.out)" ] \
    || { echo "demo: the resumed run differs from the uninterrupted one" >&2; exit 1; }
echo "bitwise identical"

say "checkpoints live in a DVC remote; manifests and .dvc files in git"
run kaudit init --remote "$WORK/dvc-remote"
run kaudit push checkpoints/heat
run kaudit status checkpoints/heat
say "the CI gate covers the heat run and replays two of its segments (config committed with it)"
printf '\n[gate]\nruns = ["checkpoints/heat"]\nsegments = 2\nseed = 1\n' >> .kaudit/config.toml
run cat .kaudit/config.toml
git add -A && git commit -q -m "heat run: manifests and .dvc files; the gate's config"

say "the owner hands their public key to an auditor out of band (not through the repository)"
run cp "$KAUDIT_HOME/keys/demo.pub" "$WORK/demo.pub"

say "the auditor's fresh clone has no data, and the auditor has their own keys and trust"
run git clone -q "$WORK/project" "$WORK/clone"
run cd "$WORK/clone"
run export KAUDIT_HOME="$WORK/auditor-home"
say "without an anchor of their own, the key the repository's store names proves nothing"
expect 1 kaudit verify checkpoints/heat
say "with the owner's key, handed over out of band, as the anchor"
run kaudit verify checkpoints/heat --trusted-key "$WORK/demo.pub"

say "a forger adds their own key to the clone's trust store and signs a checkpoint of their own"
run env KAUDIT_HOME="$WORK/forger-home" kaudit keys generate --name forger
run env KAUDIT_HOME="$WORK/forger-home" python heat.py --steps 3200 --every 200 --run-id heat-forged
run cp checkpoints/heat-forged/step-00003200.h5 checkpoints/heat/step-00003200.h5
run env KAUDIT_HOME="$WORK/forger-home" kaudit snapshot checkpoints/heat/step-00003200.h5 \
    --run heat --step 3200 --key forger --parent checkpoints/heat/step-00003000.h5.kaudit.json
say "the repository's own store now vouches for the forger, but the auditor's anchor does not"
expect 1 kaudit verify checkpoints/heat/step-00003200.h5.kaudit.json --trusted-key "$WORK/demo.pub"
say "(the demo removes the forgery again)"
rm -rf checkpoints/heat-forged checkpoints/heat/step-00003200.h5*
git checkout -q -- .kaudit

say "the auditor replays the last segment from its parent checkpoint (fetched from the remote)"
run kaudit keys generate --name auditor
run kaudit replay checkpoints/heat/step-00003000.h5.kaudit.json --attest \
    --trusted-key "$WORK/demo.pub"
run cp "$KAUDIT_HOME/keys/auditor.pub" "$WORK/auditor.pub"
run kaudit verify checkpoints/heat/step-00003000.h5.replay.json \
    --trusted-key "$WORK/demo.pub" --trusted-key "$WORK/auditor.pub"

say "runs and their chains at a glance"
run kaudit log --trusted-key "$WORK/demo.pub"
say "the reproducibility gate, as CI runs it: trust and [gate] read at the protected branch"
run kaudit gate --trust-ref origin/main --junit "$WORK/gate.xml"
say "the auditor's report: one self-contained HTML page, and Markdown for a pull request"
run kaudit report checkpoints/heat --out "$WORK/report.html" \
    --trusted-key "$WORK/demo.pub" --trusted-key "$WORK/auditor.pub"
run kaudit report checkpoints/heat --out "$WORK/report.md" \
    --trusted-key "$WORK/demo.pub" --trusted-key "$WORK/auditor.pub"
run head -n 12 "$WORK/report.md"
run export KAUDIT_HOME="$WORK/home"
run cd "$WORK/project"

say "the killed-and-resumed run against the uninterrupted one, dataset by dataset"
run kaudit diff checkpoints/heat/step-00003000.h5 checkpoints/heat-uninterrupted/step-00003000.h5

say "PyTorch: an MLP on the digits, AdamW and a cosine schedule, preempted once under kaudit run"
say "(--portable: the CPU's kernels pinned, so a replay on another CPU computes the same bits)"
cp "$ROOT/examples/torch_train/run.py" torch_train.py
git add torch_train.py && git commit -q -m "torch training"
show kaudit run --portable --retries 3 --backoff 0 -- python torch_train.py --steps 600 --every 50
kaudit run --portable --retries 3 --backoff 0 -- python torch_train.py --steps 600 --every 50 \
    > torch.out &
supervisor=$!
until ls checkpoints/torch-train/step-*.h5.kaudit.json >/dev/null 2>&1; do sleep 0.05; done
trainer=$(pgrep -P "$supervisor" -f torch_train.py | head -n 1)
say "preempt the trainer (pid $trainer): it checkpoints, exits 75, and kaudit run restarts it"
run kill -TERM "$trainer"
wait "$supervisor"
cat torch.out
run kaudit verify checkpoints/torch-train
say "the same training, never interrupted"
show kaudit run --portable -- python torch_train.py --steps 600 --every 50 --run-id torch-uninterrupted
kaudit run --portable --retries 0 -- python torch_train.py --steps 600 --every 50 \
    --run-id torch-uninterrupted > torch-reference.out 2>/dev/null
echo "preempted and resumed: $(tail -n 1 torch.out)"
echo "never interrupted:     $(tail -n 1 torch-reference.out)"
[ "$(tail -n 1 torch.out)" = "$(tail -n 1 torch-reference.out)" ] \
    || { echo "demo: the resumed training differs from the uninterrupted one" >&2; exit 1; }
echo "bitwise identical: model, optimizer, schedule and torch's generator all restored"
say "another CPU, by proxy: replay the last segment where other kernels and one thread are asked for"
say "(the run was recorded portable: the replay gives the command the recorded pins)"
run env ATEN_CPU_CAPABILITY=default MKL_CBWR=AUTO OMP_NUM_THREADS=1 \
    kaudit replay checkpoints/torch-train/step-00000600.h5.kaudit.json

say "many ranks: the heat solver on 3 MPI ranks, each pushing its strip of every step"
cd "$WORK/project" && export KAUDIT_HOME="$WORK/home"
cp "$ROOT/examples/heat_mpi/run.py" heat_mpi.py
git add heat_mpi.py && git commit -q -m "heat on MPI ranks"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # a container's root
run mpiexec --oversubscribe -n 3 python heat_mpi.py --n 64 --steps 200 --every 100 --push
run kaudit status checkpoints/heat-mpi
say "another machine: a fresh clone, no checkpoints; 2 ranks resume from the remote alone"
run git clone -q "$WORK/project" "$WORK/elsewhere"
run cd "$WORK/elsewhere"
show mpiexec --oversubscribe -n 2 python heat_mpi.py --n 64 --steps 400 --every 100 --push
mpiexec --oversubscribe -n 2 python heat_mpi.py --n 64 --steps 400 --every 100 --push \
    > heat-mpi.out
run kaudit verify checkpoints/heat-mpi --trusted-key "$WORK/demo.pub"
say "the same 400 steps on 3 ranks, never interrupted"
show mpiexec --oversubscribe -n 3 python heat_mpi.py --n 64 --steps 400 --every 100 --run-id heat-mpi-uninterrupted
mpiexec --oversubscribe -n 3 python heat_mpi.py --n 64 --steps 400 --every 100 \
    --run-id heat-mpi-uninterrupted > heat-mpi-reference.out
echo "3 ranks, then 2 elsewhere: $(tail -n 1 heat-mpi.out)"
echo "3 ranks, never stopped:   $(tail -n 1 heat-mpi-reference.out)"
[ "$(tail -n 1 heat-mpi.out)" = "$(tail -n 1 heat-mpi-reference.out)" ] \
    || { echo "demo: the run resumed elsewhere differs from the uninterrupted one" >&2; exit 1; }
echo "bitwise identical: resumed on another machine, on another rank count, from the remote"
say "the two final steps, on 2 and on 3 ranks, compared by their signed digests alone"
run kaudit diff checkpoints/heat-mpi/step-00000400 checkpoints/heat-mpi-uninterrupted/step-00000400
say "levels: every step also in each node's memory and on a partner node; a rank killed at step 150"
HEAT_LEVELS=(mpiexec --oversubscribe -n 3 python heat_mpi.py --n 64 --steps 400 --every 100
    --run-id heat-levels --levels "$WORK/ram")
show "${HEAT_LEVELS[@]}" --fault-at 150
"${HEAT_LEVELS[@]}" --fault-at 150 >/dev/null 2>&1 && { echo "demo: rank 1 was not killed" >&2; exit 1; }
echo "(the job ended: rank 1 was killed at step 150; the newest durable step is 100)"
say "started again: it resumes from the memory level, past the durable step; rank 1 killed again at 250"
show "${HEAT_LEVELS[@]}" --fault-at 250
"${HEAT_LEVELS[@]}" --fault-at 250 2>&1 >/dev/null | grep "^resumed" || true
say "rank 1's node lost as well (its memory directory emptied): its partner's copy, not the remote"
run rm -rf "$WORK/ram/node1"
show "${HEAT_LEVELS[@]}"
"${HEAT_LEVELS[@]}" 2> heat-levels.err > heat-levels.out
grep "^resumed" heat-levels.err
grep -q "from the partner level" heat-levels.err \
    || { echo "demo: the lost node's rank did not resume through its partner" >&2; exit 1; }
echo "killed twice, a node lost: $(tail -n 1 heat-levels.out)"
echo "never stopped:             $(tail -n 1 heat-mpi-reference.out)"
[ "$(tail -n 1 heat-levels.out)" = "$(tail -n 1 heat-mpi-reference.out)" ] \
    || { echo "demo: the run resumed from the levels differs from the uninterrupted one" >&2; exit 1; }
echo "bitwise identical: resumed from memory, then from a partner, each copy verified first"
run kaudit verify checkpoints/heat-levels --trusted-key "$WORK/demo.pub"

say "PyTorch data-parallel: the same training on 2 torchrun workers, pushing every step"
cd "$WORK/project"
show torchrun --standalone --nproc_per_node 2 torch_train.py --steps 200 --every 50 --hidden 32 --push --run-id torch-dp
torchrun --standalone --nproc_per_node 2 torch_train.py --steps 200 --every 50 --hidden 32 \
    --push --run-id torch-dp > torch-dp.out 2> torch-dp.err \
    || { cat torch-dp.err >&2; exit 1; }
run kaudit status checkpoints/torch-dp
say "another machine, one process: it finds the 2 workers' sharded steps in the remote and takes the newest"
run cd "$WORK/elsewhere"
show python torch_train.py --steps 200 --every 50 --hidden 32 --push --run-id torch-dp
python torch_train.py --steps 200 --every 50 --hidden 32 --push --run-id torch-dp > torch-dp-one.out
run kaudit verify checkpoints/torch-dp --trusted-key "$WORK/demo.pub"
say "and one process computing each gradient in the same 2 pieces, never on 2 workers"
show python torch_train.py --steps 200 --every 50 --hidden 32 --split 2 --run-id torch-dp-split
python torch_train.py --steps 200 --every 50 --hidden 32 --split 2 --run-id torch-dp-split \
    > torch-dp-split.out
echo "2 workers:                 $(tail -n 1 "$WORK/project/torch-dp.out")"
echo "resumed on one process:    $(tail -n 1 torch-dp-one.out)"
echo "one process, split 2:      $(tail -n 1 torch-dp-split.out)"
[ "$(tail -n 1 "$WORK/project/torch-dp.out")" = "$(tail -n 1 torch-dp-one.out)" ] \
    && [ "$(tail -n 1 torch-dp-one.out)" = "$(tail -n 1 torch-dp-split.out)" ] \
    || { echo "demo: the data-parallel training differs between worker counts" >&2; exit 1; }
echo "bitwise identical: one world of 2 workers or of 1 process, the same run and the same bits"

say "Monte Carlo on a Dask cluster of 2 worker processes, and in one process: one tally"
cd "$WORK/project"
cp "$ROOT/examples/montecarlo/run.py" pi.py
git add pi.py && git commit -q -m "pi in batches"
show python pi.py --batches 32 --samples 100000 --run-id pi-dask --engine dask --workers 2
python pi.py --batches 32 --samples 100000 --run-id pi-dask --engine dask --workers 2 \
    2>/dev/null | tail -n 1 > pi-dask.out
show python pi.py --batches 32 --samples 100000 --run-id pi-serial
python pi.py --batches 32 --samples 100000 --run-id pi-serial | tail -n 1 > pi-serial.out
echo "on Dask:       $(cat pi-dask.out)"
echo "one process:   $(cat pi-serial.out)"
[ "$(cat pi-dask.out)" = "$(cat pi-serial.out)" ] \
    || { echo "demo: the campaign on Dask differs from the serial one" >&2; exit 1; }
echo "bitwise identical: the engine scheduled the batches, the tally folds them in index order"

say "the finished campaign's certificate: every batch once, its result, its worker, the tally"
run kaudit verify checkpoints/pi-dask.campaign.json --trusted-key "$WORK/demo.pub"
say "an audit by sampling: 8 random batches proven to the certificate's Merkle root"
run kaudit verify checkpoints/pi-dask.campaign.json --trusted-key "$WORK/demo.pub" --sample 8

say "the campaign as a Slurm job array of 4 tasks, each its own run doing its share; run here one after another with Slurm's environment, and task 2 lost before it ran"
PI_ARRAY=(python pi.py --batches 32 --samples 100000 --run-id pi-array --array)
for task in 0 1 3; do
    run env SLURM_ARRAY_TASK_ID=$task SLURM_ARRAY_TASK_COUNT=4 "${PI_ARRAY[@]}"
done
show kaudit campaign pi-array --script pi-array.sbatch
kaudit campaign pi-array --script pi-array.sbatch || echo "(exit $?: batches are missing)"
say "task 2 again, as that sbatch line runs it; then every batch is in, and certified"
run env SLURM_ARRAY_TASK_ID=2 SLURM_ARRAY_TASK_COUNT=1 KAUDIT_ARRAY_TASKS=4 "${PI_ARRAY[@]}"
run kaudit campaign pi-array --certify
run kaudit verify checkpoints/pi-array.campaign.json --trusted-key "$WORK/demo.pub"
show python pi.py --batches 32 --run-id pi-array --merge
python pi.py --batches 32 --run-id pi-array --merge > pi-array.out
echo "4 array tasks: $(cat pi-array.out)"
echo "one process:   $(cat pi-serial.out)"
[ "$(cat pi-array.out)" = "$(cat pi-serial.out)" ] \
    || { echo "demo: the job array's tally differs from the serial one" >&2; exit 1; }
echo "bitwise identical: the tasks' ledgers, merged, fold in index order"

printf '\nDemo finished; its project is in %s\n' "$WORK/project"
