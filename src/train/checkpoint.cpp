// The checkpoint file format: serialize, parse and check, atomic save, resume compatibility.
#include "train/checkpoint.h"

#include <charconv>
#include <cstring>
#include <map>
#include <sstream>

#include <zlib.h>

#include "core/errors.h"
#include "core/file_io.h"
#include "core/format.h"
#include "core/rng.h"

namespace {

constexpr char kMagic[8] = {'R', 'N', '5', '0', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;          // three arrays
constexpr uint32_t kVersionWithEma = 2;   // and the weight average where the header has ema_decay
constexpr size_t kMaxHeader = 1 << 16;
// The most values an array may hold: 2^28 floats, over ten times ResNet-50's parameters. A header
// that claims more is corrupt, and a file larger than such a checkpoint is refused before it is read.
constexpr uint64_t kMaxArrayValues = uint64_t(1) << 28;
constexpr size_t kMaxCheckpointBytes = 16 + kMaxHeader + 4 * (8 + 4 * kMaxArrayValues) + 4;

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_floats(std::vector<uint8_t>& out, const std::vector<float>& v) {
  put<uint64_t>(out, v.size());
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(float));
}

// Class names in one header value: comma-separated, with '%', ',' and control bytes as %XX (a
// directory name may hold any of them).
std::string encode_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    for (unsigned char ch : names[i]) {
      char esc[4];
      std::snprintf(esc, sizeof(esc), "%%%02X", ch);
      out += ch == '%' || ch == ',' || ch < 0x20 || ch == 0x7f ? std::string(esc) : std::string(1, char(ch));
    }
  }
  return out;
}

std::vector<std::string> decode_names(const std::string& text, const std::string& file) {
  std::vector<std::string> names(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',') {
      names.emplace_back();
    } else if (text[i] == '%') {
      unsigned value = 0;
      if (i + 2 >= text.size() || std::sscanf(text.substr(i + 1, 2).c_str(), "%2X", &value) != 1)
        throw InputError(file + ": malformed class names in the header");
      names.back() += static_cast<char>(value);
      i += 2;
    } else {
      names.back() += text[i];
    }
  }
  return names;
}

// The shortest text that reads back as the same double ("0.08", not "0.080000000000000002").
std::string exact(double v) {
  char buf[40];
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

std::string header_text(const CheckpointMeta& m, bool with_ema) {
  std::ostringstream h;
  char scale[32];
  std::snprintf(scale, sizeof(scale), "%a", m.loss_scale);  // hex float: exact
  h << "precision=" << m.precision << "\nlayout=" << m.layout << "\nmodel=" << m.model
    << "\nmodel_signature=" << m.model_signature << "\nparams=" << m.params << "\nrunning=" << m.running
    << "\nimage_side=" << m.image_side << "\nclasses=" << encode_names(m.class_names)
    << "\ndata=" << m.data << "\nbatch=" << m.batch << "\nepochs=" << m.epochs << "\nseed=" << m.seed
    << "\nstep=" << m.step << "\nepoch=" << m.epoch << "\nstep_in_epoch=" << m.step_in_epoch
    << "\nloss_scale=" << scale << "\ngood_steps=" << m.good_steps << "\nskipped_steps=" << m.skipped_steps << "\n";
  if (m.lr_recorded)
    h << "lr_scaled=" << m.lr_scaled << "\nlr_reference_batch=" << m.lr_reference_batch << "\nlr=" << exact(m.lr) << "\nmin_lr=" << exact(m.min_lr)
      << "\nwarmup_epochs=" << exact(m.warmup_epochs) << "\n";
  if (with_ema) h << "ema_decay=" << exact(m.ema_decay) << "\n";
  return h.str();
}

// Reads sequentially from a byte range; running past its end is a truncation error.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& file) : p_(p), n_(n), file_(file) {}
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  // An array whose length field must equal `expected` (the header's count): a different length is
  // corruption (of the header or of the field), a file that ends inside the array is truncation.
  std::vector<float> floats(const char* what, uint64_t expected, const char* header_key) {
    const uint64_t count = get<uint64_t>(what);
    if (count != expected)
      throw InputError(file_ + ": corrupt: the array sizes disagree with the header (" + what + " holds " +
                       std::to_string(count) + " values, the header says " + header_key + "=" +
                       std::to_string(expected) + ")");
    if (count > (n_ - off_) / sizeof(float))
      throw InputError(file_ + ": truncated: the file ends inside the " + what + " (" + std::to_string(n_) +
                       " bytes, " + std::to_string(count) + " values from byte " + std::to_string(off_) + ")");
    std::vector<float> v(count);
    if (count) std::memcpy(v.data(), p_ + off_, count * sizeof(float));
    off_ += count * sizeof(float);
    return v;
  }
  std::string text(size_t len, const char* what) {
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + off_), len);
    off_ += len;
    return s;
  }
  size_t offset() const { return off_; }

 private:
  void need(size_t k, const char* what) {
    if (n_ - off_ < k) throw InputError(file_ + ": truncated (ends inside the " + std::string(what) + ")");
  }
  const uint8_t* p_;
  size_t n_, off_ = 0;
  const std::string& file_;
};

template <class T>
T parse_number(const std::map<std::string, std::string>& kv, const std::string& key, const std::string& file) {
  const auto it = kv.find(key);
  if (it == kv.end()) throw InputError(file + ": header lacks '" + key + "'");
  std::istringstream in(it->second);
  T v{};
  if (!(in >> v) || !in.eof()) throw InputError(file + ": bad value '" + it->second + "' for '" + key + "'");
  return v;
}

std::string parse_string(const std::map<std::string, std::string>& kv, const std::string& key, const std::string& file) {
  const auto it = kv.find(key);
  if (it == kv.end()) throw InputError(file + ": header lacks '" + key + "'");
  return it->second;
}

// What the header's values must satisfy whatever the run: counts in range, and a position that some
// number of steps per epoch explains (step = epoch * steps_per_epoch + step_in_epoch, with
// step_in_epoch < steps_per_epoch; check_checkpoint_position checks it against this run's).
void check_header_values(const CheckpointMeta& m, const std::string& file) {
  if (m.step < 0 || m.epoch < 0 || m.step_in_epoch < 0 || m.batch <= 0 || m.epochs <= 0 || !(m.loss_scale > 0) ||
      m.good_steps < 0 || m.skipped_steps < 0 || m.skipped_steps > m.step || m.image_side <= 0 || m.lr_reference_batch <= 0 ||
      !(m.lr >= 0 && m.min_lr >= 0 && m.warmup_epochs >= 0 && m.ema_decay >= 0 && m.ema_decay < 1))
    throw InputError(file + ": header holds out-of-range values");
  const int64_t before_epoch = m.step - m.step_in_epoch;  // steps of the epochs done
  const bool explained = m.epoch == 0 ? before_epoch == 0
                                      : before_epoch > 0 && before_epoch % m.epoch == 0 &&
                                            before_epoch / m.epoch > m.step_in_epoch;
  // (epoch is not bounded by epochs: a run resumed with a smaller --epochs saves its position as it is.)
  if (!explained)
    throw InputError(file + ": inconsistent header: step " + std::to_string(m.step) + " is not epoch " +
                     std::to_string(m.epoch) + " (0-based) plus step " + std::to_string(m.step_in_epoch) +
                     " of it for any number of steps per epoch");
}

}  // namespace

std::vector<uint8_t> serialize_checkpoint(const Checkpoint& c) {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof(kMagic));
  const bool with_ema = !c.ema.empty();
  const std::string h = header_text(c.meta, with_ema);
  put<uint32_t>(out, with_ema ? kVersionWithEma : kVersion);
  put<uint32_t>(out, static_cast<uint32_t>(h.size()));
  out.insert(out.end(), h.begin(), h.end());
  put_floats(out, c.master);
  put_floats(out, c.momentum);
  put_floats(out, c.running);
  if (with_ema) put_floats(out, c.ema);
  put<uint32_t>(out, static_cast<uint32_t>(crc32(0L, out.data(), static_cast<uInt>(out.size()))));
  return out;
}

Checkpoint parse_checkpoint(const uint8_t* bytes, size_t size, const std::string& file) {
  if (size == 0) throw InputError(file + ": empty file, not a checkpoint");
  if (size < sizeof(kMagic) || std::memcmp(bytes, kMagic, sizeof(kMagic)) != 0)
    throw InputError(file + ": not a checkpoint of this trainer (wrong magic)");
  Reader r(bytes, size, file);
  r.text(sizeof(kMagic), "magic");
  const uint32_t version = r.get<uint32_t>("version");
  if (version != kVersion && version != kVersionWithEma)
    throw InputError(file + ": checkpoint format version " + std::to_string(version) + ", this build reads versions " +
                     std::to_string(kVersion) + " and " + std::to_string(kVersionWithEma));
  const uint32_t hlen = r.get<uint32_t>("header length");
  if (hlen > kMaxHeader) throw InputError(file + ": implausible header length " + std::to_string(hlen));
  const std::string header = r.text(hlen, "header");
  std::map<std::string, std::string> kv;
  std::istringstream in(header);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) throw InputError(file + ": malformed header line '" + line + "'");
    kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  Checkpoint c;
  CheckpointMeta& m = c.meta;
  m.precision = parse_string(kv, "precision", file);
  m.layout = parse_string(kv, "layout", file);
  m.model = parse_string(kv, "model", file);
  m.model_signature = parse_number<uint64_t>(kv, "model_signature", file);
  m.params = parse_number<uint64_t>(kv, "params", file);
  m.running = parse_number<uint64_t>(kv, "running", file);
  if (kv.count("image_side")) m.image_side = parse_number<int>(kv, "image_side", file);
  if (kv.count("classes") && !kv["classes"].empty()) m.class_names = decode_names(kv["classes"], file);
  m.data = parse_string(kv, "data", file);
  m.batch = parse_number<int>(kv, "batch", file);
  m.epochs = parse_number<int>(kv, "epochs", file);
  m.seed = parse_number<uint64_t>(kv, "seed", file);
  m.step = parse_number<int64_t>(kv, "step", file);
  m.epoch = parse_number<int>(kv, "epoch", file);
  m.step_in_epoch = parse_number<int>(kv, "step_in_epoch", file);
  m.loss_scale = std::strtof(parse_string(kv, "loss_scale", file).c_str(), nullptr);
  m.good_steps = parse_number<int>(kv, "good_steps", file);
  m.skipped_steps = parse_number<int>(kv, "skipped_steps", file);
  m.lr_recorded = kv.count("lr_scaled") > 0;  // older files: a run not scaled, its schedule not recorded
  if (m.lr_recorded) {
    m.lr_scaled = parse_number<int>(kv, "lr_scaled", file) != 0;
    if (kv.count("lr_reference_batch")) m.lr_reference_batch = parse_number<int>(kv, "lr_reference_batch", file);
    m.lr = parse_number<double>(kv, "lr", file);
    m.min_lr = parse_number<double>(kv, "min_lr", file);
    m.warmup_epochs = parse_number<double>(kv, "warmup_epochs", file);
  }
  if (m.params > kMaxArrayValues || m.running > kMaxArrayValues)
    throw InputError(file + ": corrupt header: params=" + std::to_string(m.params) + ", running=" +
                     std::to_string(m.running) + " (a checkpoint holds at most " + std::to_string(kMaxArrayValues) +
                     " values per array)");
  c.master = r.floats("master weights", m.params, "params");
  c.momentum = r.floats("momentum", m.params, "params");
  c.running = r.floats("BN running statistics", m.running, "running");
  if (version == kVersionWithEma && kv.count("ema_decay")) {
    m.ema_decay = parse_number<double>(kv, "ema_decay", file);
    c.ema = r.floats("weight average", m.params, "params");
  }
  const size_t body = r.offset();
  const uint32_t stored = r.get<uint32_t>("checksum");
  if (r.offset() != size) throw InputError(file + ": " + std::to_string(size - r.offset()) + " unexpected bytes after the checksum");
  const uint32_t actual = static_cast<uint32_t>(crc32(0L, bytes, static_cast<uInt>(body)));
  if (stored != actual) throw InputError(file + ": checksum mismatch: the file is corrupt");
  check_header_values(m, file);
  return c;
}

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  const std::vector<uint8_t> bytes = serialize_checkpoint(c);
  write_file_atomic(path, bytes.data(), bytes.size());
}

Checkpoint load_checkpoint(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path, kMaxCheckpointBytes);
  return parse_checkpoint(bytes.data(), bytes.size(), path);
}

void check_checkpoint_fits(const CheckpointMeta& f, const CheckpointMeta& here, const std::string& file) {
  // Classes and image size first: they explain a model mismatch better than the model check would.
  if (!f.class_names.empty() && f.class_names != here.class_names)
    throw InputError(file + ": trained on " + std::to_string(f.class_names.size()) + " classes (" +
                     encode_names(f.class_names) + ") but the data set has " + std::to_string(here.class_names.size()) +
                     " (" + encode_names(here.class_names) + "); resume on a data set with the same classes");
  if (f.image_side != here.image_side)
    throw InputError(file + ": trained at --image-size " + std::to_string(f.image_side) + "; resume with --image-size " +
                     std::to_string(f.image_side));
  const std::string model = model_difference(f, here);
  if (!model.empty()) throw InputError(file + ": checkpoint of another model than this trainer builds: " + model);
  if (f.precision != here.precision || f.layout != here.layout)
    throw InputError(file + ": written by a " + f.precision + "/" + f.layout + " build, but this binary is " +
                     here.precision + "/" + here.layout + " (filters are stored in the build's layout and the loss "
                     "scale belongs to its precision): resume with a binary built the same way");
  if (f.batch != here.batch)
    throw InputError(file + ": trained with --batch " + std::to_string(f.batch) + "; resume with the same batch size");
  if (f.data != here.data)
    throw InputError(file + ": trained on " + f.data + "; resume with --data " + f.data);
}

std::string model_difference(const CheckpointMeta& f, const CheckpointMeta& here) {
  std::string d;
  const auto differs = [&](bool differ, const std::string& theirs, const std::string& ours) {
    if (differ) d += (d.empty() ? "" : "; ") + theirs + " in the checkpoint, " + ours + " here";
  };
  const auto count = [](uint64_t n, const char* what) { return with_commas(static_cast<long long>(n)) + what; };
  differs(f.model != here.model, "model " + f.model, here.model);
  differs(f.params != here.params, count(f.params, " parameters"), count(here.params, ""));
  differs(f.running != here.running, count(f.running, " BN running values"), count(here.running, ""));
  // Same name and counts, other tensors (a renamed layer, a transposed shape): without the signatures
  // the message would read the same on both sides.
  if (d.empty() && f.model_signature != here.model_signature)
    d = "the same " + here.model + " with " + count(here.params, " parameters") +
        ", but other tensor names or shapes (model signature " + std::to_string(f.model_signature) +
        " in the checkpoint, " + std::to_string(here.model_signature) + " here)";
  return d;
}

uint64_t model_signature(const std::vector<std::pair<std::string, std::vector<int>>>& tensors) {
  uint64_t h = 0x5EED;
  for (const auto& [name, shape] : tensors) {
    for (char ch : name) h = mix(h, static_cast<uint8_t>(ch));
    for (int d : shape) h = mix(h, static_cast<uint64_t>(d) + 0x100);
  }
  return h;
}

void check_checkpoint_position(const CheckpointMeta& m, int steps_per_epoch, const std::string& file) {
  if (m.step_in_epoch < steps_per_epoch && m.step == int64_t(m.epoch) * steps_per_epoch + m.step_in_epoch) return;
  throw InputError(file + ": saved at step " + std::to_string(m.step) + " (epoch " + std::to_string(m.epoch + 1) +
                   ", step " + std::to_string(m.step_in_epoch) + " of it), which does not fit this run's " +
                   std::to_string(steps_per_epoch) + " steps per epoch: the training set is not the size it was "
                   "(another --synthetic-size?)");
}
