#!/usr/bin/env bash
# What the shared library exports: the C API (nc_), what the installed headers declare
# (namespace normcore) and the standard-library instantiations they need; never the
# internal kernels, Eigen, nlohmann::json or anything else built into it.
#   check_exports.sh LIBNORMCORE_SO
set -euo pipefail
symbols=$(nm -D --defined-only "$1" | awk '$2 != "A" {print $3}')
# Allowed, by mangled name: the C API's functions; anything naming namespace normcore (its
# functions, typeinfo, vtables, thunks, template instantiations); std:: entities (the
# standard-library instantiations the headers' signatures need), with their typeinfo,
# vtables, guard variables and function-local statics.
std_entity='^_Z(Z|GV|T[ISVT]|Th[n0-9_]*|Tv[n0-9_]*)?N?K?(St|S[absiod]|9__gnu_cxx)|^_ZS[tabsiod]'
allowed="^nc_|8normcore|$std_entity"
# Never: anything of the internal kernel namespaces, Eigen (both builds), nlohmann::json or
# an anonymous namespace. A std:: template instantiated over such a type is not counted:
# libstdc++ declares namespace std with default visibility, so an instantiation the
# compiler keeps out of line (-O2 with sanitizers keeps some that -O3 inlines, e.g. the
# destructor loop of a vector of JSON values) stays exported, weak and identical wherever
# it is made.
internal='8normcore(3cpu|7kernels)|5Eigen|17NormcoreEigenAvx2|8nlohmann|12_GLOBAL__N_'
bad_internal=$(echo "$symbols" | grep -vE "$std_entity" | grep -E "$internal" || true)
unexpected=$(echo "$symbols" | grep -vE "$allowed" || true)
total=$(echo "$symbols" | wc -l)
status=0
if [ -n "$bad_internal" ]; then
  echo "FAIL: $(echo "$bad_internal" | wc -l) internal symbols exported, e.g.:" >&2
  echo "$bad_internal" | head -20 | c++filt >&2
  status=1
fi
if [ -n "$unexpected" ]; then
  echo "FAIL: $(echo "$unexpected" | wc -l) symbols outside nc_, normcore:: and std::, e.g.:" >&2
  echo "$unexpected" | head -20 | while read -r s; do echo "  $s = $(echo "$s" | c++filt)"; done >&2
  status=1
fi
[ $status -eq 0 ] && echo "PASS: $total exported symbols, all nc_, normcore:: or std::"
exit $status
