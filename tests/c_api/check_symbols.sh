#!/usr/bin/env bash
# The C API's ABI: the nc_ functions the shared library exports must be exactly those listed
# in exported_symbols.txt (one per line, sorted), which changes only with NC_API_VERSION.
#   check_symbols.sh LIBNORMCORE_SO EXPORTED_SYMBOLS_TXT
set -euo pipefail
exported=$(nm -D --defined-only "$1" | awk '$2 == "T" && $3 ~ /^nc_/ {print $3}' | sort)
if ! diff <(echo "$exported") "$2"; then
  echo "FAIL: the nc_ symbols of $1 differ from $2 (< exported, > listed)" >&2
  exit 1
fi
echo "PASS: $(echo "$exported" | wc -l) C API symbols, as listed"
