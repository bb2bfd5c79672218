#!/usr/bin/env bash
# The README's two commands, exactly as its first bash block gives them, in a fresh clone and a fresh venv
# (issue 42's acceptance, docs/first-hour.md). Prints one JSON object: the commit, each command's exit code and
# wall seconds, the load average before and after, and where the logs are.
#
#     bash scripts/first_hour.sh . /tmp/first-hour-1
#     for i in 1 2 3; do bash scripts/first_hour.sh . /tmp/first-hour-$i || break; done   # three in a row
set -u
src=$(cd "${1:?usage: first_hour.sh CHECKOUT WORKDIR}" && pwd)
work=${2:?usage: first_hour.sh CHECKOUT WORKDIR}
if [ -e "$work" ]; then echo "first_hour.sh: $work exists; give a new directory" >&2; exit 2; fi
mkdir -p "$work" && work=$(cd "$work" && pwd)
git clone -q "$src" "$work/clone" && cd "$work/clone" || exit 2
python3 -m venv "$work/venv" && . "$work/venv/bin/activate" || exit 2
block=$(sed -n '/^```bash$/,/^```$/p' README.md)
install_and_build=$(sed -n 2p <<< "$block")
run_tests=$(sed -n 3p <<< "$block")
load_before=$(cut -d' ' -f1 /proc/loadavg)
t=$(date +%s); bash -c "$install_and_build" > "$work/line1.log" 2>&1; rc1=$?; s1=$(( $(date +%s) - t ))
rc2=-1; s2=0
if [ "$rc1" = 0 ]; then
    t=$(date +%s); bash -c "$run_tests" > "$work/line2.log" 2>&1; rc2=$?; s2=$(( $(date +%s) - t ))
fi
printf '{"commit": "%s", "line1": {"command": "%s", "exit": %s, "wall_s": %s}, "line2": {"command": "%s", "exit": %s, "wall_s": %s, "summary": "%s"}, "load_before": %s, "load_after": %s, "logs": "%s"}\n' \
    "$(git rev-parse --short HEAD)" "$install_and_build" "$rc1" "$s1" "$run_tests" "$rc2" "$s2" \
    "$(tail -1 "$work/line2.log" 2>/dev/null | tr -d '"=')" "$load_before" "$(cut -d' ' -f1 /proc/loadavg)" "$work"
[ "$rc1" = 0 ] && [ "$rc2" = 0 ]
