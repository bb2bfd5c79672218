#!/usr/bin/env bash
# Cron wrapper: fold every new file of a drop folder into a bigknn store, unattended.
#
#   BIGKNN_STORE   the store (required)
#   BIGKNN_DROP    the drop folder (required); producers must write elsewhere and `mv` files in
#   BIGKNN_LOG     log file (default: $BIGKNN_STORE.ingest.log)
#   BIGKNN_WAIT    seconds to wait for a running writer (default 300)
#   BIGKNN_BACKEND auto, cuda or cpu (default auto)
#   BIGKNN         the bigknn command (default: bigknn)
#
# Exit codes: 0 ingested or nothing to do; 75 another writer still held the store after the wait
# (EX_TEMPFAIL: the next run picks the files up); 2 a bad input file (named in the log; nothing written);
# 1 any other failure, a full disk included (the last commit is intact; the next run resumes); 143 stopped by
# SIGTERM, 130 by SIGINT (the same: the next run resumes).
# Run it as the store's owner. As root it refuses (exit 2, saying which directory) a store, drop folder or log
# whose directory, or any directory above them, another user can write: such a user could swap what root
# writes for links to root's files between any check and the write. BIGKNN_TRUST_WRITERS=1 runs it as root
# anyway, for a store only trusted users can write (a test machine, a single-user host).
set -uo pipefail
: "${BIGKNN_STORE:?set BIGKNN_STORE}" "${BIGKNN_DROP:?set BIGKNN_DROP}"
log="${BIGKNN_LOG:-$BIGKNN_STORE.ingest.log}"

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
  for p in "$BIGKNN_STORE" "$BIGKNN_DROP" "$(dirname -- "$log")"; do
    open=$(writable_by_others "$p")
    if [ -n "$open" ]; then
      echo "bigknn-ingest.sh: refusing to run as root: $open (above $p) can be written by another user," \
           "who could turn root's writes against root's files; run this job as the store's owner" >&2
      exit 2
    fi
  done
  inside=$(find "$BIGKNN_STORE" \( ! -user 0 -o -perm /022 \) -print -quit 2>/dev/null)
  if [ -n "$inside" ]; then
    echo "bigknn-ingest.sh: refusing to run as root: $inside in the store can be written by another user;" \
         "run this job as the store's owner" >&2
    exit 2
  fi
fi
{
  echo "== $(date -Is) ingest $BIGKNN_DROP -> $BIGKNN_STORE"
  ${BIGKNN:-bigknn} ingest "$BIGKNN_STORE" --watch-dir "$BIGKNN_DROP" --wait "${BIGKNN_WAIT:-300}" \
    --busy-exit 75 --backend "${BIGKNN_BACKEND:-auto}" --json
  code=$?
  echo "== $(date -Is) exit $code"
  exit $code
} >>"$log" 2>&1
