// Builds the one-line JSON objects of --json output (no library: keys in insertion order).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& v) { return raw(key, quote(v)); }
  JsonLine& add(const std::string& key, const char* v) { return raw(key, quote(v)); }
  JsonLine& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  JsonLine& add(const std::string& key, int v) { return raw(key, std::to_string(v)); }
  JsonLine& add(const std::string& key, long v) { return raw(key, std::to_string(v)); }
  JsonLine& add(const std::string& key, long long v) { return raw(key, std::to_string(v)); }
  JsonLine& add(const std::string& key, unsigned long v) { return raw(key, std::to_string(v)); }
  JsonLine& add(const std::string& key, unsigned long long v) { return raw(key, std::to_string(v)); }
  // Non-finite numbers become null (JSON has no NaN).
  JsonLine& add(const std::string& key, double v) {
    if (!std::isfinite(v)) return raw(key, "null");
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    return raw(key, buf);
  }
  JsonLine& null(const std::string& key) { return raw(key, "null"); }
  JsonLine& add(const std::string& key, const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + quote(v[i]);
    return raw(key, s + "]");
  }
  JsonLine& add(const std::string& key, const JsonLine& nested) { return raw(key, nested.str()); }
  std::string str() const { return "{" + body_ + "}"; }

  static std::string quote(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
      else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        o += buf;
      } else o += static_cast<char>(c);
    }
    return o + "\"";
  }

 private:
  JsonLine& raw(const std::string& key, const std::string& value) {
    if (!body_.empty()) body_ += ",";
    body_ += quote(key) + ":" + value;
    return *this;
  }
  std::string body_;
};
