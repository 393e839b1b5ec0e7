#!/usr/bin/env bash
# The release gate of docs/ci.md, step by step, as a local script (tests/ci/test_ci_example.py runs it).
#
#   tests/ci/ci_example.sh OUT [LAST_RELEASE_RUN] [-- extra reportgen overrides...]
#
# OUT: a new folder for this job's files (run/, comparison/, step-summary.md).
# LAST_RELEASE_RUN: the last release's signed run folder (in CI: an artifact of the release
# job), compared with this run when given. The signing key comes from $REPORTGEN_SIGNING_KEY
# (in CI: a secret written to a file); its public half is <key>.pub.pem beside it.
# Exit code: verify's when the report does not verify, else the comparison's when it fails,
# else the run's own (0 holds, 1 fails, 3 cannot be judged).
set -euo pipefail
OUT=${1:?usage: ci_example.sh OUT [LAST_RELEASE_RUN] [-- overrides...]}
shift
BASE=""
if [[ $# -gt 0 && $1 != "--" ]]; then BASE=$1; shift; fi
[[ $# -gt 0 && $1 == "--" ]] && shift
PYTHON=${PYTHON:-python}
KEY=${REPORTGEN_SIGNING_KEY:?set REPORTGEN_SIGNING_KEY to the signing key file}
PUBLIC=${KEY%.pem}.pub.pem
mkdir -p "$OUT"
export GITHUB_STEP_SUMMARY=${GITHUB_STEP_SUMMARY:-$OUT/step-summary.md}

# 1. The claim on the release branch: the exit code is the gate, kept until the report is verified.
set +e
"$PYTHON" -m reportgen +model=mlp claim=mlp_release parity.batch_size=512 "hydra.run.dir=$OUT/run" "$@"
run_code=$?
set -e
echo "ci_example: reportgen exited $run_code"
[[ $run_code == 2 || $run_code -ge 70 ]] && exit "$run_code"  # nothing was judged

# 2. Publish the JUnit results (in CI: a test-report step reads $OUT/run/junit.xml).
test -s "$OUT/run/junit.xml"

# 3. Verify the signed report offline, as a reviewer would.
"$PYTHON" -m reportgen.verify "$OUT/run" --key "$PUBLIC"

# 4. Compare with the last release's signed run.
if [[ -n $BASE ]]; then
  "$PYTHON" -m reportgen.compare "$BASE" "$OUT/run" --key "$PUBLIC" --signing-key "$KEY" \
    --out "$OUT/comparison" --no-pdf
fi
exit "$run_code"
