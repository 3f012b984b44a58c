#!/usr/bin/env bash
# What a build for more GPU architectures costs: compiles every CUDA source of the library
# once per architecture list given (CMake's syntax: 90, 80-real, 90-virtual), all files of
# all lists at once, with the nvcc commands bench/gpu_stage.sh saved from a CUDA build, and
# prints per list the nvcc CPU time summed over the files (what the build costs on a
# machine of any core count), the longest file and the objects' size. Exits non-zero when
# a file does not compile for a list.
#   bash bench/cuda_arch_cost.sh gpu-run/nvcc-commands.txt "90" "80-real;86-real;89-real;90"
set -uo pipefail
commands=$1
shift
root=$(pwd)
work=$(mktemp -d)
TIMEFORMAT="%U %S %R"

# --generate-code flags for one list.
flags_of() {
  local flags="" a n
  IFS=';' read -ra list <<< "$1"
  for a in "${list[@]}"; do
    n=${a%-real}
    n=${n%-virtual}
    case $a in
      *-real) flags+=" --generate-code=arch=compute_$n,code=[sm_$n]" ;;
      *-virtual) flags+=" --generate-code=arch=compute_$n,code=[compute_$n]" ;;
      *) flags+=" --generate-code=arch=compute_$n,code=[compute_$n,sm_$n]" ;;
    esac
  done
  echo "$flags"
}

set_index=0
for archs in "$@"; do
  set_index=$((set_index + 1))
  dir=$work/set$set_index
  mkdir -p "$dir"
  echo "$archs" > "$dir/archs"
  flags=$(flags_of "$archs")
  file_index=0
  while IFS= read -r line; do
    file_index=$((file_index + 1))
    cmd=${line//@ROOT@/$root}
    cmd=${cmd//@ARCH@/$flags}
    cmd=${cmd//@OUT@/$dir}
    (
      { time bash -c "$cmd" > "$dir/log.$file_index" 2>&1; } 2> "$dir/time.$file_index" ||
        echo "$file_index" >> "$dir/failed"
    ) &
  done < "$commands"
done
start=$(date +%s)
wait
echo "all lists compiled at once in $(( $(date +%s) - start )) s on $(nproc) cores"

status=0
for dir in "$work"/set*; do
  cpu=$(cat "$dir"/time.* | awk '{ s += $1 + $2 } END { printf "%.0f", s }')
  longest=$(cat "$dir"/time.* | awk '{ if ($3 > m) m = $3 } END { printf "%.0f", m }')
  bytes=$(find "$dir" -name '*.o' -printf '%s\n' | awk '{ s += $1 } END { printf "%.1f", s / 1048576 }')
  files=$(find "$dir" -name '*.o' | wc -l)
  echo "architectures $(cat "$dir/archs"): $files objects, $bytes MiB; nvcc CPU time $cpu s in all, longest file $longest s wall"
  if [ -f "$dir/failed" ]; then
    status=1
    for i in $(cat "$dir/failed"); do
      echo "FAILED to compile (command $i):"
      tail -20 "$dir/log.$i"
    done
  fi
done
rm -rf "$work"
exit $status
