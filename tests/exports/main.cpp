// Checks that every symbol the installed headers promise (api_symbols.cpp wrote the tables
// this program links against) resolved, and where: with the shared library, each function,
// variable and class's type information must come from libnormcore; statically linked, from
// the program itself. Prints PASS with the counts, or each symbol that came from elsewhere.
//   api_check shared|static
#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <typeinfo>

extern const std::size_t nc_api_symbol_count;
extern const void* const nc_api_symbols[];
extern const char* const nc_api_symbol_names[];
extern const std::size_t nc_api_type_count;
extern const std::type_info* const nc_api_types[];

namespace {

// The file of the loaded object holding address, or "" when none does.
std::string object_of(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace

int main(int argc, char** argv) {
  const bool shared = argc == 2 && std::strcmp(argv[1], "shared") == 0;
  if (argc != 2 || (!shared && std::strcmp(argv[1], "static") != 0)) {
    std::fprintf(stderr, "usage: api_check shared|static\n");
    return 2;
  }
  const std::string self = object_of(reinterpret_cast<const void*>(&object_of));
  const auto expected = [&](const std::string& object) {
    return shared ? object.find("libnormcore.so") != std::string::npos : object == self;
  };
  std::string library;
  size_t wrong = 0;
  for (size_t i = 0; i < nc_api_symbol_count; ++i) {
    const std::string object = object_of(nc_api_symbols[i]);
    if (expected(object)) {
      library = object;
    } else if (++wrong <= 20) {
      std::fprintf(stderr, "FAIL: %s resolved in '%s'\n", nc_api_symbol_names[i], object.c_str());
    }
  }
  for (size_t i = 0; i < nc_api_type_count; ++i) {
    const std::string object = object_of(nc_api_types[i]);
    if (!expected(object) && ++wrong <= 20)
      std::fprintf(stderr, "FAIL: the type information of %s resolved in '%s'\n", nc_api_types[i]->name(),
                   object.c_str());
  }
  if (wrong > 0 || nc_api_symbol_count == 0) {
    std::fprintf(stderr, "FAIL: %zu of %zu symbols and %zu classes' type information not from %s\n", wrong,
                 nc_api_symbol_count, nc_api_type_count, shared ? "libnormcore.so" : "the program");
    return 1;
  }
  std::printf("PASS: %zu symbols and %zu classes' type information the headers declare, all from %s\n",
              nc_api_symbol_count, nc_api_type_count, shared ? library.c_str() : "the static library");
  return 0;
}
