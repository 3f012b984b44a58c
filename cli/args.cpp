// The normcore program's command lines (cli/args.h).
#include "cli/args.h"

#include <cmath>
#include <cstdlib>

#include "normcore/normcore.h"

namespace cli {

namespace nc = normcore;

Args parse(int argc, char** argv, const std::vector<OptionSpec>& specs) {
  Args args;
  args.command = argv[1];
  for (const OptionSpec& s : specs) args.options[s.name] = s.fallback ? s.fallback : "";
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {  // the rest is positional, options included (launch's command)
      for (++i; i < argc; ++i) args.positional.push_back(argv[i]);
      break;
    }
    if (a.rfind("--", 0) != 0) {
      args.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    size_t eq = name.find('=');
    bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "help") {
      args.options["help"] = "1";
      continue;
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& s : specs) spec = name == s.name ? &s : spec;
    NC_CHECK(spec, ValueError, "unknown option --", name, " for '", args.command, "' (see --help)");
    if (!inline_value && spec->fallback == nullptr) {
      value = "on";
    } else if (!inline_value) {
      NC_CHECK(i + 1 < argc, ValueError, "option --", name, " needs a value");
      value = argv[++i];
    }
    args.options[name] = value;
    args.given.insert(name);
  }
  return args;
}

double number(const Args& args, const std::string& name) {
  const std::string& v = args.options.at(name);
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  NC_CHECK(!v.empty() && end && *end == '\0' && std::isfinite(d), ValueError, "option --", name,
           " expects a number, got '", v, "'");
  return d;
}

bool flag(const Args& args, const std::string& name) {
  const std::string& v = args.options.at(name);
  NC_CHECK(v.empty() || v == "on" || v == "off", ValueError, "option --", name, " is on or off, got '", v, "'");
  return v == "on";
}

int64_t integer(const Args& args, const std::string& name, int64_t min) {
  double d = number(args, name);
  NC_CHECK(d == static_cast<double>(static_cast<int64_t>(d)) && d >= static_cast<double>(min), ValueError, "option --",
           name, " expects a whole number >= ", min, ", got '", args.options.at(name), "'");
  return static_cast<int64_t>(d);
}

nc::Device pick_device(const std::string& spec) {
  if (spec == "auto") return nc::best_device();
  nc::Device d(spec);
  NC_CHECK(d.is_cpu() || d.index < nc::cuda_device_count(), DeviceError, "--device ", spec, ": no such device (",
           nc::cuda_device_count(), " CUDA device(s) visible)");
  return d;
}

}  // namespace cli
