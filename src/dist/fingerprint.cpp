// Fingerprints of a run and what differs between two (fingerprint.h).
#include "dist/fingerprint.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/errors.h"

Fingerprint& Fingerprint::add(const std::string& key, const std::string& value) {
  if (key.empty() || key.find_first_of("=\n") != std::string::npos) throw Fatal("fingerprint key '" + key + "'");
  for (const auto& [k, v] : fields_)
    if (k == key) throw Fatal("fingerprint key '" + key + "' given twice");
  std::string v = value;
  std::replace(v.begin(), v.end(), '\n', ' ');
  fields_.emplace_back(key, v);
  return *this;
}

std::string Fingerprint::encode() const {
  std::string s;
  for (const auto& [k, v] : fields_) s += k + "=" + v + "\n";
  return s;
}

Fingerprint Fingerprint::decode(const std::string& text) {
  Fingerprint f;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) throw Fatal("malformed fingerprint line '" + line + "'");
    f.add(line.substr(0, eq), line.substr(eq + 1));
  }
  return f;
}

std::string fingerprint_differences(const Fingerprint& a, const std::string& a_name, const Fingerprint& b,
                                    const std::string& b_name, size_t shown) {
  const std::map<std::string, std::string> bm(b.fields().begin(), b.fields().end());
  std::vector<std::string> diffs;
  auto value_text = [](const std::string* v) { return v ? "'" + *v + "'" : std::string("absent"); };
  auto note = [&](const std::string& key, const std::string* va, const std::string* vb) {
    diffs.push_back(key + " is " + value_text(va) + " on " + a_name + " but " + value_text(vb) + " on " + b_name);
  };
  for (const auto& [k, v] : a.fields()) {
    const auto it = bm.find(k);
    if (it == bm.end()) note(k, &v, nullptr);
    else if (it->second != v) note(k, &v, &it->second);
  }
  for (const auto& [k, v] : b.fields()) {
    const bool in_a = std::any_of(a.fields().begin(), a.fields().end(), [&](const auto& f) { return f.first == k; });
    if (!in_a) note(k, nullptr, &v);
  }
  std::string s;
  for (size_t i = 0; i < diffs.size() && i < shown; ++i) s += (i ? "; " : "") + diffs[i];
  if (diffs.size() > shown) s += "; and " + std::to_string(diffs.size() - shown) + " more";
  return s;
}
