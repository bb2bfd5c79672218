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
set -uo pipefail
: "${BIGKNN_STORE:?set BIGKNN_STORE}" "${BIGKNN_DROP:?set BIGKNN_DROP}"
log="${BIGKNN_LOG:-$BIGKNN_STORE.ingest.log}"
{
  echo "== $(date -Is) ingest $BIGKNN_DROP -> $BIGKNN_STORE"
  ${BIGKNN:-bigknn} ingest "$BIGKNN_STORE" --watch-dir "$BIGKNN_DROP" --wait "${BIGKNN_WAIT:-300}" \
    --busy-exit 75 --backend "${BIGKNN_BACKEND:-auto}" --json
  code=$?
  echo "== $(date -Is) exit $code"
  exit $code
} >>"$log" 2>&1
