// The normcore program's command lines: each command's options (name, fallback, help),
// parsed into Args, and the typed reads of their values.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "normcore/device.h"

namespace cli {

// ---------------------------------------------------------------- arguments
struct Args {
  std::string command;
  std::map<std::string, std::string> options;
  std::set<std::string> given;  // the options on the command line (the rest hold their fallbacks)
  std::vector<std::string> positional;
};

struct OptionSpec {
  const char* name;
  const char* fallback;  // nullptr: a flag
  const char* help;
};

// Parses --name value and --name=value (a flag: --name, or --name=on|off) against specs; throws
// ValueError on anything else.
Args parse(int argc, char** argv, const std::vector<OptionSpec>& specs);
// The option's value as a finite number (ValueError otherwise).
double number(const Args& args, const std::string& name);
// A flag's value: off unless given (--name or --name=on), or given as --name=off.
bool flag(const Args& args, const std::string& name);
// The option's value as a whole number >= min (ValueError otherwise).
int64_t integer(const Args& args, const std::string& name, int64_t min);
// --device: auto (the best there is), cpu or cuda[:N] (DeviceError for a GPU not there).
normcore::Device pick_device(const std::string& spec);

}  // namespace cli
