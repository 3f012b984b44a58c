// What the installed headers promise the shared library exports, read from clang's JSON AST
// of them (clang++ -Xclang -ast-dump=json -Xclang -ast-dump-filter ...), and a program that
// needs every piece of it from the library:
//   - every function, constructor, destructor, operator and variable the headers declare
//     without defining (their definitions live in the library), by its mangled name;
//   - every instantiation of a function template the headers declare without defining,
//     which the headers list with `extern template` (one per dtype it exists for); a template
//     with neither a definition nor such a list is an error, since nothing says which of
//     its instantiations a user may call;
//   - the type information of every public polymorphic class whose key function (its first
//     virtual function not defined in the header) is in the library: what a user's catch
//     clause or subclass needs.
//
//   api_symbols AST.json... --symbols OUT.cpp --types OUT.cpp --list OUT.txt
//
// OUT.txt has one mangled name a line. The two C++ files build into one program with
// tests/exports/main.cpp: the first declares each symbol under its mangled name (an asm
// label) and takes its address, so the program links only when the library has them all;
// the second includes the headers and takes typeid of each class. Run, the program asks
// the dynamic loader where each address lives and fails unless it is the library.
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

using nlohmann::json;

namespace {

struct Declaration {
  std::string kind;       // the clang kind: FunctionDecl, CXXMethodDecl, VarDecl, ...
  std::string display;    // qualified name and type, for the listing
  bool defined = false;   // some declaration of it has a body, an initializer or is inline
  bool instance = false;  // an instantiation of a function template
};

struct Walk {
  std::map<std::string, Declaration> symbols;  // by mangled name
  std::vector<std::string> polymorphic;        // classes whose type information the library holds
  std::vector<std::string> errors;
  std::set<std::string> function_kinds{"FunctionDecl", "CXXMethodDecl", "CXXConstructorDecl", "CXXDestructorDecl",
                                       "CXXConversionDecl"};

  static bool has_body(const json& node) {
    for (const json& child : node.value("inner", json::array()))
      if (child.value("kind", "") == "CompoundStmt" || child.value("kind", "") == "CXXTryStmt") return true;
    return false;
  }

  static bool is_virtual(const json& node) {
    if (node.value("virtual", false)) return true;
    for (const json& child : node.value("inner", json::array()))
      if (child.value("kind", "") == "OverrideAttr" || child.value("kind", "") == "FinalAttr") return true;
    return false;
  }

  // Whether a function declaration's definition is in the header itself.
  static bool defined_here(const json& node) {
    return has_body(node) || node.value("inline", false) || node.value("constexpr", false) ||
           node.contains("explicitlyDefaulted") || node.value("explicitlyDeleted", false) || node.value("pure", false);
  }

  void function(const json& node, const std::string& scope) {
    if (node.value("isImplicit", false) || !node.contains("mangledName")) return;
    if (node.value("storageClass", "") == "static" && node.value("kind", "") == "FunctionDecl") return;
    const std::string type = node.contains("type") ? node["type"].value("qualType", "") : "";
    Declaration& d = symbols[node["mangledName"].get<std::string>()];
    d.kind = node.value("kind", "");
    d.display = scope + node.value("name", "") + " : " + type;
    d.defined = d.defined || defined_here(node);
  }

  void variable(const json& node, const std::string& scope, bool member) {
    const std::string storage = node.value("storageClass", "");
    const bool declared_only = member ? storage == "static" : storage == "extern";
    if (!declared_only || !node.contains("mangledName")) return;
    Declaration& d = symbols[node["mangledName"].get<std::string>()];
    d.kind = "VarDecl";
    d.display = scope + node.value("name", "");
    d.defined = d.defined || node.contains("init") || node.value("constexpr", false) || node.value("inline", false);
  }

  void function_template(const json& node, const std::string& scope) {
    const json& inner = node.value("inner", json::array());
    const json* pattern = nullptr;
    std::vector<const json*> instances;
    for (const json& child : inner) {
      if (function_kinds.count(child.value("kind", "")) == 0) continue;
      if (pattern == nullptr) pattern = &child;
      else instances.push_back(&child);
    }
    if (pattern == nullptr || defined_here(*pattern)) return;  // instantiated where it is used
    if (instances.empty()) {
      errors.push_back("the template " + scope + node.value("name", "") +
                       " is declared without a definition and without `extern template` declarations "
                       "of its instantiations in the library");
      return;
    }
    for (const json* instance : instances) {
      function(*instance, scope);
      if (instance->contains("mangledName")) symbols[(*instance)["mangledName"].get<std::string>()].instance = true;
    }
  }

  // Whether a class's type information is emitted in the library: some virtual function
  // of it is declared here and defined there (so the class has a key function there).
  bool key_function_in_library(const json& record) const {
    for (const json& child : record.value("inner", json::array())) {
      if (function_kinds.count(child.value("kind", "")) == 0 || !is_virtual(child)) continue;
      if (child.value("isImplicit", false) || defined_here(child)) continue;
      return true;
    }
    return false;
  }

  void record(const json& node, const std::string& scope, bool is_public) {
    const std::string name = node.value("name", "");
    if (name.empty() || node.value("isImplicit", false) || !node.value("completeDefinition", false)) return;
    const std::string qualified = scope + name;
    const json data = node.value("definitionData", json::object());
    if (is_public && data.value("isPolymorphic", false) && key_function_in_library(node))
      polymorphic.push_back(qualified);
    std::string access = node.value("tagUsed", "") == "class" ? "private" : "public";
    for (const json& child : node.value("inner", json::array())) {
      const std::string kind = child.value("kind", "");
      if (kind == "AccessSpecDecl") access = child.value("access", access);
      else if (kind == "CXXRecordDecl") record(child, qualified + "::", is_public && access == "public");
      else declaration(child, qualified + "::", true);
    }
  }

  // Whether a declaration at scope is normcore's: in namespace normcore, or a C API function.
  // (The dump's filter matches by substring, so it brings std::ios_base::sync_with_stdio too.)
  static bool ours(const json& node, const std::string& scope) {
    return scope.rfind("normcore::", 0) == 0 || (scope.empty() && node.value("name", "").rfind("nc_", 0) == 0);
  }

  void declaration(const json& node, const std::string& scope, bool member) {
    const std::string kind = node.value("kind", "");
    if ((function_kinds.count(kind) != 0 || kind == "VarDecl") && !ours(node, scope)) return;
    if (function_kinds.count(kind) != 0) {
      function(node, scope);
    } else if (kind == "VarDecl") {
      variable(node, scope, member);
    } else if (kind == "FunctionTemplateDecl") {
      function_template(node, scope);
    } else if (kind == "FriendDecl") {
      for (const json& child : node.value("inner", json::array()))
        if (function_kinds.count(child.value("kind", "")) != 0) function(child, scope);
    } else if (kind == "CXXRecordDecl" || kind == "ClassTemplateSpecializationDecl") {
      record(node, scope, true);
    } else if (kind == "NamespaceDecl") {
      const std::string name = node.value("name", "");
      if (name.empty()) return;  // an anonymous namespace holds nothing the library exports
      for (const json& child : node.value("inner", json::array())) declaration(child, scope + name + "::", false);
    } else if (kind == "LinkageSpecDecl") {
      for (const json& child : node.value("inner", json::array())) declaration(child, scope, false);
    }
    // ClassTemplateDecl and the rest: defined where they are used, nothing to export.
  }
};

// A C++ identifier for the symbol at index i.
std::string reference_name(size_t i) { return "nc_api_reference_" + std::to_string(i); }

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  std::string symbols_path, types_path, list_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--symbols" || arg == "--types" || arg == "--list") && i + 1 < argc) {
      (arg == "--symbols" ? symbols_path : arg == "--types" ? types_path : list_path) = argv[++i];
    } else {
      inputs.push_back(arg);
    }
  }
  if (inputs.empty() || symbols_path.empty() || types_path.empty() || list_path.empty()) {
    std::cerr << "usage: api_symbols AST.json... --symbols OUT.cpp --types OUT.cpp --list OUT.txt\n";
    return 2;
  }
  Walk walk;
  for (const std::string& path : inputs) {
    std::ifstream in(path);
    if (!in) {
      std::cerr << "api_symbols: cannot read " << path << "\n";
      return 2;
    }
    // -ast-dump-filter writes one JSON object per matching top-level declaration.
    while (in >> std::ws && in.peek() != EOF) {
      json node;
      in >> node;
      walk.declaration(node, "", false);
    }
  }
  for (const std::string& error : walk.errors) std::cerr << "api_symbols: " << error << "\n";
  if (!walk.errors.empty()) return 1;

  std::vector<std::pair<std::string, Declaration>> wanted;
  for (const auto& [mangled, d] : walk.symbols)
    if (!d.defined) wanted.emplace_back(mangled, d);

  std::ofstream list(list_path), symbols(symbols_path), types(types_path);
  symbols << "// Generated by tests/exports/api_symbols.cpp: every symbol the installed headers declare\n"
             "// and the library defines, declared under its mangled name and referenced.\n"
             "#include <cstddef>\n\n";
  for (size_t i = 0; i < wanted.size(); ++i) {
    const bool variable = wanted[i].second.kind == "VarDecl";
    symbols << "extern \"C\" " << (variable ? "char " : "void ") << reference_name(i) << (variable ? "" : "()")
            << " __asm__(\"" << wanted[i].first << "\");  // " << wanted[i].second.display << "\n";
    list << wanted[i].first << "\n";
  }
  symbols << "\nextern const std::size_t nc_api_symbol_count = " << wanted.size() << ";\n"
          << "extern const void* const nc_api_symbols[] = {\n";
  for (size_t i = 0; i < wanted.size(); ++i)
    symbols << "    reinterpret_cast<const void*>(&" << reference_name(i) << "),\n";
  symbols << "    nullptr};\nextern const char* const nc_api_symbol_names[] = {\n";
  for (const auto& [mangled, d] : wanted) symbols << "    \"" << mangled << "\",\n";
  symbols << "    nullptr};\n";

  types << "// Generated by tests/exports/api_symbols.cpp: the type information of every public\n"
           "// polymorphic class whose key function the library defines.\n"
           "#include <cstddef>\n#include <typeinfo>\n\n#include \"api_headers.h\"\n\n"
        << "extern const std::size_t nc_api_type_count = " << walk.polymorphic.size() << ";\n"
        << "extern const std::type_info* const nc_api_types[] = {\n";
  for (const std::string& name : walk.polymorphic) types << "    &typeid(" << name << "),\n";
  types << "    nullptr};\n";

  size_t instances = 0, variables = 0;
  for (const auto& [mangled, d] : wanted) {
    instances += d.instance;
    variables += d.kind == "VarDecl";
  }
  std::cout << "api_symbols: " << wanted.size() - variables << " functions (" << instances
            << " of them template instantiations), " << variables << " variables, " << walk.polymorphic.size()
            << " classes' type information\n";
  return 0;
}
