# What the scripts share; sourced, not run.
#
# phase NAME COMMAND...   runs COMMAND; when NORMCORE_PHASE_LOG names a file (.ci/run sets
#                         it), appends "NAME<tab>seconds" to it, so CI can print what each
#                         phase cost.
# launcher_args           prints the CMake arguments that compile through ccache when it is
#                         installed (nothing otherwise; NORMCORE_CCACHE=0 turns it off). The
#                         cache lives where ccache keeps it (~/.cache/ccache unless CCACHE_DIR
#                         says otherwise), outside the clone, and paths are taken relative to
#                         the clone, so a fresh clone on a warm machine finds what an earlier
#                         one compiled.

phase() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  if [ -n "${NORMCORE_PHASE_LOG:-}" ]; then
    printf '%s\t%d\n' "$name" $((SECONDS - start)) >> "$NORMCORE_PHASE_LOG"
  fi
}

launcher_args() {
  if [ "${NORMCORE_CCACHE:-1}" = 0 ] || ! command -v ccache > /dev/null; then
    return 0
  fi
  echo "-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
}

# ccache's settings for this tree: the clone's path out of the hashes (and of the debug
# information's compilation directory), and the precompiled headers of the test suite
# usable from the cache. Depend mode hashes the headers a compile read as they are on
# disk: in the preprocessor mode a change to a header's comments alone left the hash of
# the test suite's precompiled header unchanged, so a cached one built from the old header
# came back, and GCC, which knows the headers in a precompiled header by their bytes, took
# the changed header for another one and read it a second time (redefinition errors).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
export CCACHE_DEPEND=${CCACHE_DEPEND:-true}
