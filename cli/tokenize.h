// normcore tokenize: GPT-2 token ids of text, from files (each encoded on its own, their ids
// one after another) or standard input ("-"), printed on one line or written as an llm.c token
// shard with a line of counts and timings; with decode, token ids (printed ones, or token
// shards ending in .bin) back to their bytes on standard output.
#pragma once

#include <string>
#include <vector>

struct TokenizeOptions {
  std::string tokenizer;            // a folder that text::BpeTokenizer::load reads
  std::vector<std::string> inputs;  // none: standard input
  std::string out;                  // empty: print the ids
  bool special = false;             // "<|endoftext|>" is the special token
  bool decode = false;
};

// The exit status; throws normcore::Error for what it cannot do.
int run_tokenize(const TokenizeOptions& options);
