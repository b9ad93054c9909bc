#!/bin/sh
# The test of `git bisect run` in a kernel repository: which commit made a case fail or its kernel slower
# (docs/run.md, "The commit that caused it"). Run it from the kernel repository's root:
#
#   git bisect start BAD GOOD
#   BSA_BUILD='bash build.sh --pkg && ./build_out/*.run --quiet && cmake --build harness-build' \
#   BSA_DEVICE='--binary harness-build/bsa_grad_harness' BSA_SPECS=/abs/cases/smoke.yaml BSA_OUT=/abs/out/bisect \
#   BSA_BASELINE=/abs/good.json git bisect run /path/to/bsa/scripts/bisect_kernel.sh
#
#   BSA_BUILD     shell command that builds (and installs) the kernel and the harness at this commit
#   BSA_SPECS     the case specs (files or folders), as a shell would split them
#   BSA_OUT       the cases' folder: `bsa check` generates them on the first step and reuses them after (gen
#                 does not depend on the kernel)
#   BSA_DEVICE    the device options, as a shell would split them (--binary B, --device torch_npu, --cmd 'T')
#   BSA_BASELINE  the good commit's `--json` report, made with --time (`bsa check ... --time --json good.json`)
#   BSA           how to call bsa (default: bsa); BSA_CHECK_OPTIONS more `bsa check` options (default: --time;
#                 --time-threshold 0.05, --time-runs 50, ...)
#
# Exit status, as `git bisect run` reads it: 0 good; 1 bad: a case failed (bsa check exit 1) or a kernel is
# slower than in the baseline (exit 4); 125 skip this commit: it does not build, its cases cannot be judged
# (exit 3), or bsa was misused (exit 2); 130 (interrupted) stops the bisection.
set -u
: "${BSA:=bsa}" "${BSA_CHECK_OPTIONS:=--time}"
sh -c "$BSA_BUILD" >&2 || exit 125
eval "set -- $BSA_SPECS $BSA_DEVICE $BSA_CHECK_OPTIONS"  # options quoted as on a command line
# shellcheck disable=SC2086  # $BSA is a command of several words on purpose (python -m bsa_cli)
$BSA check "$@" -o "$BSA_OUT" --baseline "$BSA_BASELINE" >&2
case $? in
0) exit 0 ;;
1 | 4) exit 1 ;;
130) exit 130 ;;
*) exit 125 ;;
esac
