// The normcore command-line program: train, evaluate and use Fashion-MNIST classifiers,
// train a byte-level GPT on the fortunes corpus and write text with it, and check the ops
// against reference cases.
//   normcore train [options]            train, print test accuracy per epoch, save a checkpoint
//   normcore eval --checkpoint F        test accuracy and confusion matrix
//   normcore predict --checkpoint F IMAGE...   label 28x28 PGM/PNG images
//   normcore train-lm [options]         train a GPT, print validation loss, save a checkpoint
//   normcore generate --checkpoint F --prompt TEXT   continue a text, streaming it
//   normcore conformance DIR [--device cpu|cuda|all]   run every case in DIR; exit 0 when all pass
//   normcore tokenize --tokenizer DIR [FILE...]   GPT-2 token ids of text, printed or as a shard
//   normcore onnx-test FOLDER...                   ONNX backend tests (a build with ONNX)
//   normcore onnx-run MODEL.onnx [INPUT...]        an ONNX model on input files
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/training.h"
#include "normcore/error.h"
#include "normcore/gpt.h"
#include "normcore/models.h"

namespace nc = normcore;

namespace {

using namespace cli;

const char* kDefaultData = "/usr/share/datasets/fashion-mnist";

// The data-parallel options, last in train's and train-lm's.
const std::vector<OptionSpec> kDataParallelOptions = {
    {"nproc", "1",
     "data-parallel processes on this machine (one per GPU, started through 'normcore launch'); "
     "--batch-size is per process"},
    {"max-restarts", "0",
     "with --nproc: when a process fails, start them all again at most this many times (with --resume "
     "auto they continue from the last checkpoint)"},
    {"shard-optimizer", "off",
     "data-parallel: on: each rank keeps its share of the optimizer's state and updates those parameters "
     "(ZeRO stage 1; the same training, less memory a rank); checkpoints hold the whole state"},
    {"reduce-precision", "auto",
     "data-parallel: the dtype gradients are averaged in: auto (their own: fp32 under --precision bf16) or bf16 "
     "(half the bytes between GPUs; the average rounded to bf16)"},
    {"timeout", "300",
     "data-parallel: seconds a rank waits for the others (meeting, a collective) before the job "
     "fails"},
};
std::vector<OptionSpec> with_data_parallel(std::vector<OptionSpec> specs) {
  specs.insert(specs.end(), kDataParallelOptions.begin(), kDataParallelOptions.end());
  return specs;
}

const std::vector<OptionSpec> kTrainOptions = with_data_parallel({
    {"data", kDefaultData, "folder with the Fashion-MNIST .gz files"},
    {"model", "mlp-layernorm", "mlp, mlp-layernorm, mlp-groupnorm, mlp-l1norm, mlp-frobnorm, cnn-gn or cnn-bn"},
    {"epochs", "12", "passes over the training set"},
    {"batch-size", "128", "samples per step"},
    {"lr", "0.001", "peak learning rate"},
    {"optimizer", "adamw", "sgd (with momentum 0.9), adam or adamw"},
    {"weight-decay", "0.0001", "weight decay"},
    {"label-smoothing", "0.1", "cross-entropy label smoothing"},
    {"warmup", "200", "warm-up steps of the cosine learning-rate schedule"},
    {"clip", "5.0", "clip the gradient norm to this (0: off)"},
    {"seed", "0", "seed of initialization, dropout and shuffling"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
    {"out", "normcore-fashion.safetensors", "checkpoint written after every epoch"},
    {"log", "",
     "metrics as JSON lines (epoch, train loss, samples/s and lr at its end; test accuracy), appended on "
     "--resume"},
    {"plot", "", "an SVG of the loss and accuracy curves, rewritten after every epoch"},
    {"resume", "",
     "checkpoint to continue from (its model, seed and state; other options as given); auto: --out when "
     "that file exists, else a new run"},
    {"limit", "0", "use only the first N training samples (0: all)"},
    {"workers", "auto",
     "data-loading threads (0: load on the training thread; auto: with --augment on half the "
     "cores among the job's ranks, 1 to 4, else 1); the batches do not depend on it"},
    {"augment", "off", "on: each training image randomly cropped (28 x 28 of the image padded by 2) and mirrored"},
    {"stop-after", "0", "stop after this many epochs, as if interrupted (0: run all)"},
    {"detect-anomaly", "off", "on: check every op's result and gradient for NaN/Inf, naming the op (slow)"},
    {"precision", "fp32", "fp32, tf32 (f32 on TF32 tensor cores), bf16 or fp16 (autocast; fp16 with loss scaling)"},
    {"cuda-graph", "auto",
     "on: replay each training step as one CUDA graph; auto: on for CUDA unless "
     "--detect-anomaly or data-parallel; off"},
});
const std::vector<OptionSpec> kEvalOptions = {
    {"checkpoint", "normcore-fashion.safetensors", "checkpoint to evaluate"},
    {"data", kDefaultData, "folder with the Fashion-MNIST .gz files"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kPredictOptions = {
    {"checkpoint", "normcore-fashion.safetensors", "checkpoint to use"},
    {"resnet", "",
     "instead: a torchvision ResNet (resnet18, resnet34, resnet50, resnet101) classifying color "
     "images (PPM, PGM or PNG, any size)"},
    {"weights", "", "with --resnet: its state_dict as safetensors"},
    {"labels", "", "with --resnet: a file of class names, one a line (empty: class numbers)"},
    {"top", "5", "with --resnet: the most likely classes printed per image"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kTrainLmOptions = with_data_parallel({
    {"data", nc::models::kFortunesDir,
     "fortunes folder (its files without a '.') or one fortune file (bytes); or "
     "token shards in llm.c's format, a path or pattern ending in .bin "
     "('dir/*_train_*.bin')"},
    {"val-data", "", "with token shards: the validation shards (a path or pattern)"},
    {"vocab", "50257", "with token shards: the vocabulary (GPT-2's by default; every id is checked against it)"},
    {"model", "",
     "gpt2, gpt2-medium, gpt2-large or gpt2-xl: GPT-2's sizes (the size options given override "
     "them); empty: the sizes below"},
    {"layers", "6", "transformer blocks"},
    {"heads", "6", "attention heads"},
    {"embed", "384", "embedding width (divisible by heads)"},
    {"context", "256", "tokens of context"},
    {"norm", "layernorm", "layernorm or rmsnorm"},
    {"dropout", "0.1", "dropout on the embeddings and the residual branches (0 with --model unless given)"},
    {"batch-size", "64", "windows per step"},
    {"workers", "auto",
     "data-loading threads (0: load on the training thread; auto: 1); the batches do not "
     "depend on it"},
    {"steps", "3000", "optimizer steps"},
    {"lr", "0.001", "peak learning rate"},
    {"min-lr", "0.0001", "learning rate at the end of the cosine schedule"},
    {"warmup", "100", "warm-up steps of the cosine schedule"},
    {"weight-decay", "0.1", "AdamW weight decay of the matrices and embeddings (not biases or norms)"},
    {"clip", "1.0", "clip the gradient norm to this (0: off)"},
    {"eval-interval", "250", "steps between validation losses and checkpoints"},
    {"eval-batches", "8", "validation batches (of batch-size windows, evenly spaced)"},
    {"sample", "300", "bytes of text to print at the end"},
    {"precision", "fp32", "fp32, tf32 (f32 on TF32 tensor cores), bf16 or fp16 (autocast; fp16 with loss scaling)"},
    {"cuda-graph", "auto",
     "on: replay each training step as one CUDA graph; auto: on for CUDA unless "
     "data-parallel; off"},
    {"seed", "0", "seed of initialization, batches and dropout"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
    {"out", "normcore-gpt.safetensors", "checkpoint written at every evaluation"},
    {"log", "", "metrics as JSON lines (step, loss, lr, tokens/s; validation loss), appended on --resume"},
    {"plot", "", "an SVG of the train and validation loss curves, rewritten at every evaluation"},
    {"resume", "",
     "checkpoint to continue from (its model, seed and state; other options as given); auto: --out when "
     "that file exists, else a new run"},
    {"init", "",
     "initial weights: a train-lm checkpoint's model, or a safetensors file under the model's "
     "state_dict names (e.g. saved by another trainer); not with --resume"},
    {"hf-out", "",
     "also write the trained model to this folder as a Hugging Face GPT-2 checkpoint "
     "(config.json, model.safetensors) at the end"},
    {"shuffle", "on", "on: the training windows in a new random order each epoch; off: in order"},
    {"recompute", "none",
     "gelu: keep only each MLP's GELU input for the backward and compute its output again "
     "there (less memory, one more pass); none: keep both"},
    {"attention", "auto",
     "CUDA attention engine: auto (cuDNN's fused attention from 2^21 scores a call, else "
     "normcore's kernels), native (normcore's kernels: no cuDNN workspace, which is 2 x B x "
     "heads x context^2 bytes in the backward) or cudnn"},
    {"deterministic", "off",
     "on: CUDA ops give the same bits every run (the Hopper attention backward on its "
     "two-kernel form, up to 1.25x its time), so a resumed run ends as an uninterrupted "
     "one on the GPU too; off: grad_q summed with atomics there"},
    {"stop-after", "0", "stop after this many steps, as if interrupted (0: run all)"},
    {"benchmark", "0",
     "time this many training steps after 3 warm-up steps and print ms/step, tokens/s and peak "
     "device memory; no evaluation, checkpoint or sample (0: train)"},
});
const std::vector<OptionSpec> kGenerateOptions = {
    {"checkpoint", "normcore-gpt.safetensors", "GPT checkpoint (from train-lm)"},
    {"model", "", "a Hugging Face GPT-2 folder (config.json, model.safetensors) instead of --checkpoint"},
    {"tokenizer", "",
     "with --model: GPT-2's tokenizer files (encoder.json and vocab.bpe, vocab.json and "
     "merges.txt, or tokenizer.json); empty: those in the model's folder"},
    {"prompt", "", "text to continue (empty: start a new fortune; with --model, a new document)"},
    {"tokens", "300",
     "bytes (tokens with --model) to generate; past the context the model sees the last "
     "context ones"},
    {"temperature", "0.8", "sampling temperature (0: greedy)"},
    {"top-k", "0", "sample among the k most likely tokens (0: all)"},
    {"top-p", "1", "then among the most likely tokens whose probabilities add up to P (1: all)"},
    {"seed", "0", "seed of the sampling: the same seed gives the same text"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kLaunchOptions = {
    {"nproc", "1", "ranks on this machine, usually one per GPU"},
    {"nnodes", "1", "machines in the job, each running one launcher"},
    {"node-rank", "0", "this machine's index among them, 0 to nnodes - 1"},
    {"master-addr", "127.0.0.1", "address of node 0, where rank 0 serves the rendezvous"},
    {"master-port", "29500", "port of the rendezvous on node 0"},
    {"max-restarts", "0",
     "when a rank fails, stop the others and start the job again, at most this many times (the ranks "
     "see the count in NORMCORE_RESTART_COUNT; a training command with --resume auto continues from "
     "its last checkpoint)"},
};
const std::vector<OptionSpec> kTokenizeOptions = {
    {"tokenizer", "",
     "folder of GPT-2's tokenizer files: encoder.json and vocab.bpe, vocab.json and merges.txt, "
     "or tokenizer.json"},
    {"out", "", "write the ids as an llm.c token shard (.bin) instead of printing them"},
    {"special", nullptr, "\"<|endoftext|>\" in the text is GPT-2's end-of-text token (otherwise it is text)"},
    {"decode", nullptr, "read token ids instead (printed ones, or token shards ending in .bin) and print their text"},
};
const std::vector<OptionSpec> kConformanceOptions = {
    {"device", "all", "cpu, cuda[:N], or all (the CPU, then cuda:0 when there is one)"},
};
const std::vector<OptionSpec> kOnnxRunOptions = {
    {"device", "cpu", "cpu, cuda[:N] or auto"},
    {"random", nullptr, "run on random inputs of the graph's dims instead of files"},
    {"out", "", "write the outputs, by name, to this safetensors file"},
    {"repeat", "0", "then run this many more times and print the median time"},
    {"profile", "0", "then run this many more times eagerly and print the time per op type"},
    {"tf32", nullptr, "TF32 tensor cores for f32 matrix products and convolutions on CUDA"},
    {"cuda-graph", nullptr, "on CUDA, record the run as a CUDA graph and replay it (onnx::Model::run)"},
};
const std::vector<OptionSpec> kOnnxTestOptions = {
    {"device", "cpu", "cpu, cuda[:N], or all (the CPU, then cuda:0 when there is one)"},
    {"min-passed", "-1", "succeed when at least this many pass (-1: when all do)"},
    {"atol", "1e-7", "a float output passes within atol + rtol |expected| of each expected value"},
    {"rtol", "1e-3", "(ONNX's backend-test tolerances are the defaults)"},
};

void usage(std::ostream& os) {
  os << "usage: normcore <command> [options]\n\n"
        "commands:\n"
        "  train     train a Fashion-MNIST classifier\n"
        "  eval      print a checkpoint's test accuracy and confusion matrix\n"
        "  predict   classify 28x28 PGM or PNG images with a checkpoint, or color images with a ResNet\n"
        "  train-lm  train a byte-level GPT on the fortunes corpus\n"
        "  generate  continue a prompt with a GPT checkpoint\n"
        "  conformance  run the reference cases in a folder against every device\n"
        "  tokenize  GPT-2 token ids of text (stdin or files), printed or written as a token shard\n"
        "  launch    run a command as the local ranks of a data-parallel job\n"
#if NORMCORE_HAS_ONNX
        "  onnx-run  list an ONNX model's inputs and outputs, or run it on input files\n"
        "  onnx-test run ONNX backend test folders (model.onnx, test_data_set_*) and say which pass\n"
#endif
        "\n"
        "'normcore <command> --help' lists a command's options.\n";
}

void command_usage(std::ostream& os, const std::string& command, const std::vector<OptionSpec>& specs) {
  os << "usage: normcore " << command << " [options]"
     << (command == "predict"       ? " IMAGE..."
         : command == "conformance" ? " DIR"
         : command == "tokenize"    ? " [FILE...]"
         : command == "launch"      ? " -- COMMAND..."
         : command == "onnx-test"   ? " FOLDER..."
         : command == "onnx-run"    ? " MODEL.onnx [INPUT.pb... | INPUTS.safetensors]"
                                    : "")
     << "\n\noptions:\n";
  for (const OptionSpec& s : specs)
    os << "  --" << std::left << std::setw(18) << s.name << s.help
       << (s.fallback && *s.fallback ? std::string(" (default ") + s.fallback + ")" : "") << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  const std::vector<OptionSpec>* specs = command == "train"         ? &kTrainOptions
                                         : command == "eval"        ? &kEvalOptions
                                         : command == "predict"     ? &kPredictOptions
                                         : command == "train-lm"    ? &kTrainLmOptions
                                         : command == "generate"    ? &kGenerateOptions
                                         : command == "conformance" ? &kConformanceOptions
                                         : command == "launch"      ? &kLaunchOptions
                                         : command == "tokenize"    ? &kTokenizeOptions
#if NORMCORE_HAS_ONNX
                                         : command == "onnx-test" ? &kOnnxTestOptions
                                         : command == "onnx-run"  ? &kOnnxRunOptions
#endif
                                                                 : nullptr;
  if (!specs) {
    std::cerr << "normcore: unknown command '" << command << "'\n\n";
    usage(std::cerr);
    return 2;
  }
  g_argv.assign(argv, argv + argc);
  try {
    Args args = parse(argc, argv, *specs);
    if (args.options.count("help")) {
      command_usage(std::cout, command, *specs);
      return 0;
    }
    if (command == "train") return train(args);
    if (command == "eval") return eval(args);
    if (command == "conformance") return conformance(args);
    if (command == "train-lm") return train_lm(args);
    if (command == "generate") return generate(args);
    if (command == "launch") return launch(args);
    if (command == "tokenize") return tokenize(args);
#if NORMCORE_HAS_ONNX
    if (command == "onnx-test") return onnx_test(args);
    if (command == "onnx-run") return onnx_run(args);
#endif
    return predict(args);
  } catch (const nc::ValueError& e) {
    std::cerr << "normcore " << command << ": " << e.what() << "\n";
    return 2;
  } catch (const nc::Error& e) {
    std::cerr << "normcore " << command << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // a defect of normcore's, reported rather than aborting
    std::cerr << "normcore " << command << ": internal error: " << e.what() << "\n";
    return 1;
  }
}
