#!/bin/sh
# The test of `git bisect run` in a kernel repository: which commit made a case fail or its kernel slower
# (docs/run.md, "The commit that caused it"). Run it from the kernel repository's root:
#
#   git bisect start BAD GOOD
#   BSA_BUILD='bash build.sh --pkg && ./build_out/*.run --quiet && cmake --build harness-build' \
#   BSA_DEVICE='--binary harness-build/bsa_grad_harness' BSA_OUT=/abs/out/bisect BSA_BASELINE=/abs/good.json \
#   git bisect run /path/to/bsa/scripts/bisect_kernel.sh
#
#   BSA_BUILD     shell command that builds (and installs) the kernel and the harness at this commit
#   BSA_DEVICE    bsa run's device options, as a shell would split them (--binary B, --device torch_npu,
#                 --cmd 'TEMPLATE')
#   BSA_OUT       cases written once by `bsa gen` before bisecting (gen does not depend on the kernel)
#   BSA_BASELINE  `bsa compare --json` report of the good commit, made with `bsa run --time`
#   BSA           how to call bsa (default: bsa); BSA_RUN_OPTIONS more `bsa run` options (default:
#                 --time); BSA_COMPARE_OPTIONS more `bsa compare` options (--time-threshold 0.05, ...)
#
# Exit status, as `git bisect run` reads it: 0 good; 1 bad: a case failed (bsa compare exit 1) or a kernel is
# slower than in the baseline (exit 4); 125 skip this commit: it does not build, the run left cases that
# cannot be judged (bsa run or compare exit 3), or bsa was misused (exit 2).
set -u
: "${BSA:=bsa}" "${BSA_RUN_OPTIONS:=--time}" "${BSA_COMPARE_OPTIONS:=}"
sh -c "$BSA_BUILD" >&2 || exit 125
eval "set -- $BSA_DEVICE $BSA_RUN_OPTIONS"  # options quoted as on a command line
# shellcheck disable=SC2086  # $BSA is a command of several words on purpose (python -m bsa_cli)
$BSA run "$BSA_OUT" "$@" >&2
case $? in
0 | 1) ;;   # 1: repeated runs differed, which bsa compare judges
*) exit 125 ;;
esac
eval "set -- $BSA_COMPARE_OPTIONS"
# shellcheck disable=SC2086
$BSA compare "$BSA_OUT" --baseline "$BSA_BASELINE" "$@" >&2
case $? in
0) exit 0 ;;
1 | 4) exit 1 ;;
*) exit 125 ;;
esac
