// Command-line parsing of bin/train, and its --help text.
#include "train/options.h"

#include <thread>

#include "data/augment.h"
#include "data/data_choice.h"
#include "model/fused_patterns.h"

namespace {

using Flag = FlagRow<Options>;
const auto show = show_number;

// One row per flag, in --help order: a table, longer than a function should be, read row by row.
const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      data_flag<Options>("--data"),
      data_flag<Options>("--data-dir"),
      data_flag<Options>("--synthetic-size"),
      data_flag<Options>("--image-size"),
      data_flag<Options>("--skip-bad-images"),
      data_flag<Options>("--cache-decoded"),
      {"--epochs", "N", "passes over the training set", [](const Options& o) { return std::to_string(o.epochs); },
       [](Options& o, const std::string& v) { o.epochs = (int)parse_long("--epochs", v, 1, 100000); }},
      {"--steps", "N", "stop after N steps in all (0: run every epoch)", [](const Options& o) { return std::to_string(o.steps); },
       [](Options& o, const std::string& v) { o.steps = parse_long("--steps", v, 0, 1000000000L); }},
      data_flag<Options>("--batch"),
      {"--lr", "F", "peak learning rate", [](const Options& o) { return show(o.lr); },
       [](Options& o, const std::string& v) { o.lr = parse_double("--lr", v, 0.0, 100.0); }},
      {"--min-lr", "F", "learning rate at the end of the cosine decay", [](const Options& o) { return show(o.min_lr); },
       [](Options& o, const std::string& v) { o.min_lr = parse_double("--min-lr", v, 0.0, 100.0); }},
      {"--warmup-epochs", "F", "epochs of linear learning-rate warm-up before the cosine decay", [](const Options& o) { return show(o.warmup_epochs); },
       [](Options& o, const std::string& v) { o.warmup_epochs = parse_double("--warmup-epochs", v, 0.0, 100000.0); }},
      {"--no-lr-scaling", "", "on several GPUs or with --accumulate, take --lr, --min-lr and --warmup-epochs as given instead of scaling them with the global batch (docs/multi-gpu.md)", [](const Options&) { return std::string("scaled: the rates x global batch/--batch, i.e. x GPUs x --accumulate"); },
       [](Options& o, const std::string&) { o.lr_scaling = false; }},
      {"--warmup-cap", "F", "on several GPUs or with --accumulate, the warm-up grows with the global batch from --warmup-epochs up to F epochs", [](const Options& o) { return show(o.warmup_cap); },
       [](Options& o, const std::string& v) { o.warmup_cap = parse_double("--warmup-cap", v, 0.0, 100000.0); }},
      {"--momentum", "F", "SGD momentum", [](const Options& o) { return show(o.momentum); },
       [](Options& o, const std::string& v) { o.momentum = parse_double("--momentum", v, 0.0, 0.999999); }},
      {"--wd", "F", "weight decay (conv and linear weights only; BN parameters and biases are not decayed)", [](const Options& o) { return show(o.weight_decay); },
       [](Options& o, const std::string& v) { o.weight_decay = parse_double("--wd", v, 0.0, 1.0); }},
      {"--no-nesterov", "", "plain momentum instead of Nesterov", [](const Options&) { return std::string("Nesterov on"); },
       [](Options& o, const std::string&) { o.nesterov = false; }},
      {"--seed", "N", "seed of weights, data order, augmentation and synthetic data", [](const Options& o) { return std::to_string(o.seed); },
       [](Options& o, const std::string& v) { o.seed = (uint64_t)parse_long("--seed", v, 0, 0x7fffffffffffffffL); }},
      {"--no-eval", "", "skip the test-set evaluation after each epoch", [](const Options&) { return std::string("evaluate"); },
       [](Options& o, const std::string&) { o.eval = false; }},
      {"--label-smoothing", "F", "label smoothing of the training loss: the target is 1 - F + F/classes at the label, F/classes elsewhere", [](const Options& o) { return show(o.label_smoothing); },
       [](Options& o, const std::string& v) { o.label_smoothing = parse_double("--label-smoothing", v, 0.0, 0.999); }},
      {"--ema", "F", "evaluate and save an exponential moving average of the weights with decay F (min(F, (1 + step)/(10 + step)) at each step; 0: none)", [](const Options& o) { return show(o.ema); },
       [](Options& o, const std::string& v) { o.ema = parse_double("--ema", v, 0.0, 0.999999); }},
      {"--crop-pad", "N", "the training augmentation's random crop shifts each image by up to N pixels each way (0: flips only); at most half the image side", [](const Options& o) { return o.crop_pad < 0 ? std::to_string(crop_pad_for(o.image_size)) + " (--image-size/8)" : std::to_string(o.crop_pad); },
       [](Options& o, const std::string& v) { o.crop_pad = (int)parse_long("--crop-pad", v, 0, 512); }},
      {"--tta-flip", "", "evaluate each test image and its horizontal mirror, scoring the mean of their logits", [](const Options&) { return std::string("off"); },
       [](Options& o, const std::string&) { o.tta_flip = true; }},
      {"--zero-init-residual", "", "start each residual block as its shortcut: its last BN's scale (gamma) 0 instead of 1 (a fresh start; a resume loads the checkpoint's)", [](const Options&) { return std::string("off"); },
       [](Options& o, const std::string&) { o.zero_init_residual = true; }},
      {"--workers", "N", "loader threads of the pinned loader", [](const Options&) { return std::to_string(default_workers()) + " (min(cores - 1, 8))"; },
       [](Options& o, const std::string& v) { o.workers = (int)parse_long("--workers", v, 1, 256); }},
      {"--workspace-mb", "N", "cuDNN workspace limit in MiB", [](const Options& o) { return std::to_string(o.workspace_mb); },
       [](Options& o, const std::string& v) { o.workspace_mb = parse_long("--workspace-mb", v, 0, 1 << 20); }},
      {"--autotune-cache", "FILE", "file of measured cuDNN algorithms (autotune builds)", [](const Options& o) { return o.autotune_cache; },
       [](Options& o, const std::string& v) { o.autotune_cache = v; }},
      {"--no-tf32", "", "fp32 convs and GEMMs without TF32 tensor cores", [](const Options&) { return std::string("TF32 allowed"); },
       [](Options& o, const std::string&) { o.tf32 = false; }},
      {"--deterministic", "", "deterministic cuDNN algorithms: two runs give bit-identical losses", [](const Options&) { return std::string("off"); },
       [](Options& o, const std::string&) { o.deterministic = true; }},
      {"--no-fuse", "LIST", kNoFuseHelp, [](const Options&) { return std::string(kDefaultUnfusedText); },
       [](Options& o, const std::string& v) {
         o.no_fuse_patterns = parse_with("--no-fuse", v, parse_fused_pattern_list);
         o.no_fuse_given = true;
       }},
      {"--no-cuda-graph", "", "launch each step's kernels one by one, not as one CUDA graph (cudagraph builds)", [](const Options&) { return std::string("CUDA graph"); },
       [](Options& o, const std::string&) { o.cuda_graph = false; }},
      {"--loss-scale", "F", "initial dynamic loss scale (fp16 builds)", [](const Options& o) { return show(o.loss_scale); },
       [](Options& o, const std::string& v) { o.loss_scale = parse_double("--loss-scale", v, 1.0, 16777216.0); }},
      {"--loss-scale-window", "N", "good steps before the loss scale doubles", [](const Options& o) { return std::to_string(o.loss_scale_window); },
       [](Options& o, const std::string& v) { o.loss_scale_window = (int)parse_long("--loss-scale-window", v, 1, 1000000); }},
      {"--warmup-steps", "N", "steps before the steady-state window", [](const Options& o) { return std::to_string(o.warmup_steps); },
       [](Options& o, const std::string& v) { o.warmup_steps = (int)parse_long("--warmup-steps", v, 0, 1000000); }},
      {"--profile-steps", "N", "steps in the steady-state window (cudaProfilerStart/Stop, --trace)", [](const Options& o) { return std::to_string(o.profile_steps); },
       [](Options& o, const std::string& v) { o.profile_steps = (int)parse_long("--profile-steps", v, 1, 1000000); }},
      {"--trace", "FILE", "write a Chrome trace (Perfetto) of the window through CUPTI", [](const Options&) { return std::string("off"); },
       [](Options& o, const std::string& v) { o.trace = v; }},
      {"--progress-every", "N", "steps between progress updates (read asynchronously)", [](const Options& o) { return std::to_string(o.progress_every); },
       [](Options& o, const std::string& v) { o.progress_every = (int)parse_long("--progress-every", v, 1, 1000000); }},
      {"--json", "", "one JSON line per epoch and one at the end", [](const Options&) { return std::string("off"); },
       [](Options& o, const std::string&) { o.json = true; }},
      {"--loss-log", "FILE", "write every step's training loss to FILE (\"step loss\" lines, written at epoch ends)", [](const Options&) { return std::string("off"); },
       [](Options& o, const std::string& v) { o.loss_log = v; }},
      {"--sample-png", "FILE", "save the first augmented training batch as a PNG grid (see what the model sees)", [](const Options&) { return std::string("off"); },
       [](Options& o, const std::string& v) { o.sample_png = v; }},
      {"--save", "FILE", "write a checkpoint here at the end and on SIGINT/SIGTERM", [](const Options&) { return std::string("none"); },
       [](Options& o, const std::string& v) { o.save = v; }},
      {"--save-every", "N", "also save every N steps (needs --save)", [](const Options& o) { return std::to_string(o.save_every); },
       [](Options& o, const std::string& v) { o.save_every = parse_long("--save-every", v, 0, 1000000000L); }},
      {"--resume", "FILE", "continue from a checkpoint", [](const Options&) { return std::string("none"); },
       [](Options& o, const std::string& v) { o.resume = v; }},
      {"--gpus", "N", "start N ranks on this machine's GPUs (data parallel over NCCL; --batch is per GPU)", [](const Options& o) { return std::to_string(o.gpus); },
       [](Options& o, const std::string& v) { o.gpus = (int)parse_long("--gpus", v, 1, 1024); }},
      {"--bucket-mb", "F", "gradient bucket size in MiB for the all-reduce during backward (the first bucket is 1 MiB)", [](const Options& o) { return show(o.bucket_mb); },
       [](Options& o, const std::string& v) { o.bucket_mb = parse_double("--bucket-mb", v, 0.001, 100000.0); }},
      {"--last-bucket-mb", "F", "cap in MiB of the last gradient bucket, whose all-reduce starts when backward ends and cannot hide behind it (0: what the other buckets leave over, as PyTorch DDP)", [](const Options& o) { return show(o.last_bucket_mb); },
       [](Options& o, const std::string& v) { o.last_bucket_mb = parse_double("--last-bucket-mb", v, 0.0, 100000.0); }},
      {"--allreduce-dtype", "T", "type the weight gradients are averaged in: fp16 or fp32", [](const Options&) { return std::string("fp16 in fp16 builds, fp32 in fp32 builds (the gradients' own type)"); },
       [](Options& o, const std::string& v) {
         if (v != "fp16" && v != "fp32") throw UsageError("--allreduce-dtype: '" + v + "' is not fp16 or fp32");
         o.allreduce_dtype = v;
       }},
      {"--grad-compression", "C", "how the weight gradients cross between ranks: none, or int8 (8-bit with error feedback: a quarter of fp32's bytes, half of fp16's)", [](const Options& o) { return o.grad_compression; },
       [](Options& o, const std::string& v) {
         if (v != "none" && v != "int8") throw UsageError("--grad-compression: '" + v + "' is not none or int8");
         o.grad_compression = v;
       }},
      {"--accumulate", "N", "micro-batches of --batch images per optimizer step, their gradients summed and all-reduced once (a step takes N x --batch x GPUs images)", [](const Options& o) { return std::to_string(o.accumulate); },
       [](Options& o, const std::string& v) { o.accumulate = (int)parse_long("--accumulate", v, 1, 1024); }},
      {"--dist-timeout", "S", "seconds before a rank that is missing, dead or hung stops the others", [](const Options& o) { return show(o.dist_timeout); },
       [](Options& o, const std::string& v) { o.dist_timeout = parse_double("--dist-timeout", v, 1.0, 86400.0); }},
      {"--help", "", "print this help and the build's optimizations", [](const Options&) { return std::string(""); },
       [](Options& o, const std::string&) { o.help = true; }},
  };
  return table;
}

}  // namespace

std::string default_autotune_cache() { return in_program_repository("autotune-cache.txt"); }

int default_workers() {
  const unsigned cores = std::thread::hardware_concurrency();
  const int w = cores > 1 ? static_cast<int>(cores) - 1 : 1;
  return w < 8 ? w : 8;
}

Options parse_options(int argc, const char* const* argv) {
  Options o;
  parse_flags(flags(), argc, argv, o);
  if (o.save_every > 0 && o.save.empty()) throw UsageError("--save-every needs --save FILE");
  if (o.min_lr > o.lr) throw UsageError("--min-lr must not exceed --lr");
  if (o.grad_compression != "none" && !o.allreduce_dtype.empty())
    throw UsageError("--allreduce-dtype " + o.allreduce_dtype + " and --grad-compression " + o.grad_compression +
                     " both choose what the weight gradients are reduced in: give one");
  check_data_options(o);
  if (o.crop_pad > o.image_size / 2)
    throw UsageError("--crop-pad " + std::to_string(o.crop_pad) + " is over half the image side (" +
                     std::to_string(o.image_size / 2) + " at --image-size " + std::to_string(o.image_size) + ")");
  check_files_distinct(o, false);
  return o;
}

std::vector<std::pair<std::string, std::string>> output_files(const Options& o, bool autotune_cache_written) {
  return {{"--save", o.save},
          {"--loss-log", o.loss_log},
          {"--sample-png", o.sample_png},
          {"--trace", o.trace},
          {"--autotune-cache", autotune_cache_written ? o.autotune_cache : ""}};
}

void check_files_distinct(const Options& o, bool autotune_cache_written) {
  std::vector<std::pair<std::string, std::string>> files = {{"--resume", o.resume}};
  for (auto& f : output_files(o, autotune_cache_written)) files.push_back(std::move(f));
  check_distinct_files(files, {{"--resume", "--save"}});
}

std::string usage_text() {
  return "usage: train [flags]\n"
         "Trains ResNet-50 (CIFAR stem) on CIFAR-10, Fashion-MNIST, synthetic data or a folder of your images.\n\nflags:\n" +
         flags_help(flags());
}
