#!/usr/bin/env bash
# Cron job: fold every new file of a drop folder into a bigknn store, unattended, for years.
#
# cron runs jobs with PATH=/usr/bin:/bin and none of your shell's variables: no venv. Tell this script where
# bigknn is, in the crontab (see crontab.example) or by editing the default below:
#
#   BIGKNN          the bigknn command: the absolute path of the venv's console script
#                   (/opt/bigknn/.venv/bin/bigknn), or an interpreter and the module ("/usr/bin/python3 -m bigknn").
#                   Default: the .venv of the checkout this script is in, else `bigknn` on cron's PATH.
#   BIGKNN_STORE    the store (required)
#   BIGKNN_DROP     the drop folder (required); producers write elsewhere and `mv` files in
#   BIGKNN_LOG      the log, one JSON line per run (default: $BIGKNN_STORE.ingest.log)
#   BIGKNN_SEEN     the list of files this job ingested, so that files left in the drop folder are neither
#                   re-read nor re-logged (default: $BIGKNN_STORE.ingested; delete it and the next run re-checks
#                   each file against the store by size and sha256)
#   BIGKNN_SETTLE_S a file modified less than this many seconds ago is still being written: left for the next
#                   run (default 60)
#   BIGKNN_DONE     1: move each ingested file to DROP/.done/ (default 0: leave it, listed in BIGKNN_SEEN)
#   BIGKNN_WAIT     seconds to wait for a running writer of the store, or another run of this job (default 300)
#   BIGKNN_BACKEND  auto, cuda or cpu (default auto)
#
# Each file is ingested by its own `bigknn ingest STORE --input FILE --json` (so a bad file is known by name
# and never blocks the others), oldest first:
#   ingested   its rows are committed; the file is moved to DROP/.done/ with BIGKNN_DONE=1
#   rejected   bigknn refused it (wrong dimension or dtype, truncated, NaN/Inf rows, unknown extension, empty),
#              or it is a symbolic link (never followed): moved to DROP/.rejected/NAME, its reason in
#              DROP/.rejected/NAME.reason (an existing name there gets a .1, .2, ... suffix; nothing is replaced)
#   left       modified within BIGKNN_SETTLE_S, or changed while read: the next run takes it
# Hidden names (.name: files in transit) and anything not a file or link are ignored.
#
# The log gets one JSON line per run: time, store, drop, exit, seconds, ingested, rows_added, rows (the store's,
# after the run; null when there was nothing to ingest), rejected [{file, reason}], left, already_ingested (a
# count), untried (files a stopped run did not reach) and error (why the run stopped). A run that exits non-zero
# also prints that line on stderr (cron mails it).
#
# Exit codes (every one this script gives):
#   0   done: every file ingested, already ingested or left for the next run
#   1   bigknn failed on a file for another reason (a full disk, a crash: see "error"), or a file could not be
#       moved or the BIGKNN_SEEN list written; the last commit is intact, the file stays, the next run resumes
#   2   refused: run as root with a store, drop folder or log other users can write (see below; stderr only,
#       nothing logged), or bigknn refused the store itself (not a file of the drop folder); the files not
#       reached stay
#   3   done, but one or more files were rejected this run (see DROP/.rejected/): alert a person
#   75  busy (EX_TEMPFAIL): another writer held the store, or another run of this job held the drop folder,
#       for BIGKNN_WAIT seconds; the files not reached stay, the next run picks them up
#   78  configuration (EX_CONFIG): BIGKNN_STORE or BIGKNN_DROP unset or the log not writable (stderr only),
#       the drop folder missing, DROP/.rejected or DROP/.done not a directory of its own (a link), or the
#       bigknn command not found
#   130, 143  stopped by SIGINT / SIGTERM (the running ingest is stopped too); the next run resumes
#
# Run it as the store's owner. As root it refuses (exit 2, saying which directory) a store, drop folder or log
# whose directory, or any directory above them, another user can write: such a user could swap what root
# writes for links to root's files between any check and the write. BIGKNN_TRUST_WRITERS=1 runs it as root
# anyway, for a store only trusted users can write (a test machine, a single-user host).
set -uo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
BIGKNN=${BIGKNN:-$( [ -x "$here/../../.venv/bin/bigknn" ] && echo "$here/../../.venv/bin/bigknn" || echo bigknn )}

if [ -z "${BIGKNN_STORE:-}" ] || [ -z "${BIGKNN_DROP:-}" ]; then
  echo "bigknn-ingest.sh: set BIGKNN_STORE (the store) and BIGKNN_DROP (the drop folder)" >&2
  exit 78
fi
store=$BIGKNN_STORE
drop=${BIGKNN_DROP%/}
log=${BIGKNN_LOG:-$store.ingest.log}
seen=${BIGKNN_SEEN:-$store.ingested}
settle_s=${BIGKNN_SETTLE_S:-60}
wait_s=${BIGKNN_WAIT:-300}

# the first directory at or above $1 that a user other than root can write (owner not root, or group/other
# write permission), or nothing
writable_by_others() {
  local d
  d=$(realpath -m -- "$1")
  while :; do
    if [ -e "$d" ]; then
      read -r uid mode < <(stat -L -c '%u %a' -- "$d")
      if [ "$uid" != 0 ] || (( (8#$mode & 8#022) != 0 )); then
        echo "$d"
        return
      fi
    fi
    [ "$d" = / ] && return
    d=$(dirname -- "$d")
  done
}

if [ "$(id -u)" = 0 ] && [ "${BIGKNN_TRUST_WRITERS:-0}" != 1 ]; then
  for p in "$store" "$drop" "$(dirname -- "$log")" "$(dirname -- "$seen")"; do
    open=$(writable_by_others "$p")
    if [ -n "$open" ]; then
      echo "bigknn-ingest.sh: refusing to run as root: $open (above $p) can be written by another user," \
           "who could turn root's writes against root's files; run this job as the store's owner" >&2
      exit 2
    fi
  done
  inside=$(find "$store" \( ! -user 0 -o -perm /022 \) -print -quit 2>/dev/null)
  if [ -n "$inside" ]; then
    echo "bigknn-ingest.sh: refusing to run as root: $inside in the store can be written by another user;" \
         "run this job as the store's owner" >&2
    exit 2
  fi
fi

if ! { : >>"$log"; } 2>/dev/null; then
  echo "bigknn-ingest.sh: cannot write the log $log (set BIGKNN_LOG)" >&2
  exit 78
fi

# ---- the run's record -------------------------------------------------------------------------------------
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=${EPOCHREALTIME//[!0-9]/}
ingested=() rejected=() left=() untried=()
rows_added=0 rows=null already=0 work=""

json_str() {  # $1 as a JSON string (the C locale: bytes)
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/\\t}; s=${s//$'\r'/\\r}
  s=${s//[$'\001'-$'\037']/?}
  printf '"%s"' "$s"
}

json_list() {  # the arguments as a JSON list of strings
  local out="" x
  for x in "$@"; do out+="${out:+, }$(json_str "$x")"; done
  printf '[%s]' "$out"
}

# write the run's one log line (and on stderr unless the run succeeded), clean up what the run made, exit $1
finish() {
  local code=$1 error=${2:-} us line rej="" i
  us=$(( ${EPOCHREALTIME//[!0-9]/} - t0 ))
  for ((i = 0; i < ${#rejected[@]}; i += 2)); do
    rej+="${rej:+, }{\"file\": $(json_str "${rejected[i]}"), \"reason\": $(json_str "${rejected[i+1]}")}"
  done
  line="{\"time\": \"$started\", \"store\": $(json_str "$store"), \"drop\": $(json_str "$drop"), \"exit\": $code"
  line+=", \"seconds\": $(printf '%d.%03d' $((us / 1000000)) $((us % 1000000 / 1000)))"
  line+=", \"ingested\": $(json_list "${ingested[@]}"), \"rows_added\": $rows_added, \"rows\": $rows"
  line+=", \"rejected\": [$rej], \"left\": $(json_list "${left[@]}"), \"already_ingested\": $already"
  [ ${#untried[@]} -gt 0 ] && line+=", \"untried\": $(json_list "${untried[@]}")"
  [ -n "$error" ] && line+=", \"error\": $(json_str "$error")"
  line+="}"
  printf '%s\n' "$line" >>"$log" || code=1
  [ "$code" = 0 ] || printf 'bigknn-ingest.sh: %s\n' "$line" >&2
  [ -n "$work" ] && rm -f -- "$work/out" "$work/err" && rmdir -- "$work"
  exit "$code"
}

child=""
on_signal() {  # stop the running ingest (it exits at its next safe point), then log and exit 128+signal
  if [ -n "$child" ]; then
    kill -"$1" "$child" 2>/dev/null && wait "$child"
    untried=("${names[@]:i}")
  fi
  finish "$2" "stopped by SIG$1"
}
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

# ---- configuration checks -----------------------------------------------------------------------------------
read -ra bigknn <<<"$BIGKNN"
if [ ${#bigknn[@]} = 0 ] || ! command -v -- "${bigknn[0]}" >/dev/null; then
  finish 78 "bigknn command not found: '$BIGKNN' (PATH is $PATH): set BIGKNN to the venv's bin/bigknn"
fi
[ -d "$drop" ] || finish 78 "the drop folder $drop is not a directory"
for sub in .rejected .done; do
  if [ -L "$drop/$sub" ] || { [ -e "$drop/$sub" ] && [ ! -d "$drop/$sub" ]; }; then
    finish 78 "$drop/$sub is not a directory of its own (a link or a file): move it away"
  fi
done

# one run at a time per drop folder: the lock is on the log, which only this job writes
if command -v flock >/dev/null; then
  exec 9>>"$log"
  flock -w "$wait_s" 9 || finish 75 "another run of this job still held $log after ${wait_s} s"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/bigknn-ingest.XXXXXX") || finish 1 "cannot make a temporary directory"

# ---- what each file becomes -------------------------------------------------------------------------------
state_of() {  # a file's inode, size and mtime (ns), as listed and as checked after its ingest
  stat -c '%i %s %.9Y' -- "$1" 2>/dev/null
}

move_into() {  # move $1 into DROP/$2/ under its name, or NAME.1, NAME.2, ... (never replacing); echoes the path
  local dir="$drop/$2" name=${1##*/} dest n=0
  mkdir -p -- "$dir" && [ ! -L "$dir" ] || return 1
  dest="$dir/$name"
  while [ -e "$dest" ] || [ -L "$dest" ] || [ -e "$dest.reason" ] || [ -L "$dest.reason" ]; do
    n=$((n + 1)); dest="$dir/$name.$n"
  done
  mv -n -T -- "$1" "$dest" && [ ! -e "$1" ] && [ ! -L "$1" ] && printf '%s' "$dest"
}

reject() {  # $1 the file, $2 why: into DROP/.rejected/ with the reason beside it
  local dest
  rejected+=("${1##*/}" "$2")
  dest=$(move_into "$1" .rejected) || finish 1 "cannot move $1 into $drop/.rejected"
  (set -o noclobber; printf '%s\n' "$2" >"$dest.reason") || finish 1 "cannot write $dest.reason"
}

error_of() {  # bigknn's one-line error: the message of its --json error, as JSON escapes it, else its last line
  local e
  e=$(sed -n 's/^{"error": "\(.*\)", "exit": [0-9]*}$/\1/p' "$work/err" | tail -n 1)
  [ -n "$e" ] && { printf '%s' "$e"; return; }
  grep -v '^[[:space:]]*$' "$work/err" | tail -n 1
}

unescape() {  # bigknn's error for a person: its quotes and backslashes (\uXXXX of names other than the file's stay)
  local e=${1//\\\"/\"}
  printf '%s' "${e//\\\\/\\}"
}

py_json_escape() {  # $1 as bigknn's JSON errors write it (Python's json.dumps): to find a path named in one
  local LC_ALL=C s=$1 out="" i j b nb cp need ok
  for ((i = 0; i < ${#s}; i++)); do
    printf -v b '%d' "'${s:i:1}"
    (( b < 0 )) && b=$((b + 256))
    if (( b >= 0x20 && b < 0x7f )); then
      case ${s:i:1} in '"') out+='\"' ;; '\') out+='\\' ;; *) out+=${s:i:1} ;; esac
      continue
    fi
    case $b in 8) out+='\b'; continue ;; 9) out+='\t'; continue ;; 10) out+='\n'; continue ;;
               12) out+='\f'; continue ;; 13) out+='\r'; continue ;; esac
    need=0 cp=$b
    if (( b >= 0xf0 && b < 0xf8 )); then need=3 cp=$((b & 7))
    elif (( b >= 0xe0 )) && (( b < 0xf0 )); then need=2 cp=$((b & 15))
    elif (( b >= 0xc2 )) && (( b < 0xe0 )); then need=1 cp=$((b & 31))
    fi
    ok=1
    for ((j = 1; j <= need; j++)); do
      printf -v nb '%d' "'${s:i+j:1}"; (( nb < 0 )) && nb=$((nb + 256))
      (( (nb & 0xc0) == 0x80 )) || { ok=0; break; }
      cp=$(( (cp << 6) | (nb & 63) ))
    done
    if (( b >= 0x80 && (need == 0 || ! ok) )); then  # not UTF-8: Python's surrogateescape
      cp=$((0xdc00 + b)) need=0
    fi
    i=$((i + need))
    if (( cp > 0xffff )); then
      cp=$((cp - 0x10000))
      printf -v out '%s\\u%04x\\u%04x' "$out" $((0xd800 + (cp >> 10))) $((0xdc00 + (cp & 1023)))
    else
      printf -v out '%s\\u%04x' "$out" "$cp"
    fi
  done
  printf '%s' "$out"
}

number_in_out() {  # the integer value of key $1 in bigknn's JSON report (its first: top-level keys come first)
  grep -o "\"$1\": [0-9]*" "$work/out" | head -n 1 | grep -o '[0-9]*$'
}

run_bigknn() {  # bigknn with these arguments, its stdout and stderr in $work; in the background, so that a
  # signal to this script is handled at once (the handler stops it)
  "${bigknn[@]}" "$@" >"$work/out" 2>"$work/err" &
  child=$!
  wait "$child"
  local code=$?
  child=""
  return "$code"
}

# ---- the drop folder, oldest first ------------------------------------------------------------------------
now=$(date +%s)
seen_list=""
[ -f "$seen" ] && seen_list=$(<"$seen")
files=() names=() keys=() states=()
while IFS=$'\t' read -r -d '' _ type name; do
  path="$drop/$name"
  case $type in
    l) reject "$path" "a symbolic link (never followed): put the file itself in the drop folder"; continue ;;
    f) ;;
    *) continue ;;
  esac
  state=$(state_of "$path") || continue  # renamed away since the listing
  key="$state $(printf '%q' "$name")"  # one line whatever the name
  mtime=${state##* }
  if [ -n "$seen_list" ] && grep -Fxq -- "$key" <<<"$seen_list"; then
    already=$((already + 1))
  elif (( now - ${mtime%.*} < settle_s )); then
    left+=("$name")
  else
    files+=("$path") names+=("$name") keys+=("$key") states+=("$state")
  fi
done < <(find "$drop" -mindepth 1 -maxdepth 1 ! -name '.*' -printf '%T@\t%y\t%f\0' | sort -z -n)

# ---- one ingest per file ----------------------------------------------------------------------------------
i=0
if [ ${#files[@]} -gt 0 ]; then  # the store's rows before: rows_added counts a resumed ingest's rows too
  run_bigknn info "$store" --json
  code=$?
  if [ "$code" != 0 ]; then
    untried=("${names[@]}")
    finish "$( [ "$code" = 2 ] && echo 2 || echo 1 )" "$(unescape "$(error_of)")"
  fi
  rows=$(number_in_out rows)
  [ -n "$rows" ] || finish 1 "no row count in bigknn info's report: $(head -c 200 "$work/out")"
fi
rows_before=$rows
for ((i = 0; i < ${#files[@]}; i++)); do
  path=${files[i]} name=${names[i]}
  if [ "$(state_of "$path")" != "${states[i]}" ]; then  # replaced (by a link too) or changed since listed
    left+=("$name")
    continue
  fi
  run_bigknn ingest "$store" --input "$path" --wait "$wait_s" --busy-exit 75 --backend "${BIGKNN_BACKEND:-auto}" \
    --json
  code=$?
  case $code in
    0)
      rows=$(number_in_out rows)
      rows_added=$((rows - rows_before))
      if [ "$(number_in_out rows_added)" -gt 0 ] || grep -q '"resumed": "' "$work/out"; then
        ingested+=("$name")
      else
        already=$((already + 1))  # ingested before (same size and sha256), by another job or by hand
      fi
      printf '%s\n' "${keys[i]}" >>"$seen" || finish 1 "cannot append to $seen"
      if [ "${BIGKNN_DONE:-0}" = 1 ]; then
        move_into "$path" .done >/dev/null || finish 1 "cannot move $path into $drop/.done"
      fi
      ;;
    2)
      error=$(error_of)
      if [ "$(state_of "$path")" != "${states[i]}" ]; then
        left+=("$name")  # changed while read: still being written
      elif esc=$(py_json_escape "$path") && [[ $error == *"$esc"* ]]; then
        reject "$path" "$(unescape "${error%%"$esc"*}")$path$(unescape "${error#*"$esc"}")"
      else  # not about this file: the store, or the command line
        untried=("${names[@]:i}")
        finish 2 "$(unescape "$error")"
      fi
      ;;
    75|130|143)
      untried=("${names[@]:i}")
      finish "$code" "$(unescape "$(error_of)")"
      ;;
    *)
      untried=("${names[@]:i}")
      finish 1 "bigknn exit $code on $path: $(unescape "$(error_of)")"
      ;;
  esac
done
[ ${#rejected[@]} -gt 0 ] && finish 3
finish 0
