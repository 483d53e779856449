// The fusion report's lines and the rule of run_fused (model/fusion_report.h).
#include "model/fusion_report.h"

#include <cstdio>

bool run_fused(float fused_ms, float unfused_ms) {
  if (fused_ms < 0 || unfused_ms < 0) return true;  // not measured: fusion saves passes over memory
  return fused_ms <= unfused_ms;
}

std::vector<std::string> fusion_report_lines(const FusionReport& r) {
  if (r.off_for_determinism)
    return {"fused batch norm: off under --deterministic (cuDNN's fused statistics and gradients reduce in an order "
            "that changes from run to run); every conv runs as the plain conv with our BN kernels"};
  std::vector<std::string> lines;
  std::vector<std::string> notes;
  if (r.half_coefficients) notes.push_back(std::to_string(r.half_coefficients) + " read the BN scale/bias in fp16");
  if (r.seconds >= 0) {
    char s[64];
    std::snprintf(s, sizeof s, "chosen in %.1f s", r.seconds);
    notes.push_back(s);
  }
  if (r.plans_cached > 0)
    notes.push_back(std::to_string(r.plans_cached) + " of " + std::to_string(r.plans) +
                    " plans from the autotune cache");
  std::string noted;
  for (const std::string& n : notes) noted += (noted.empty() ? " (" : "; ") + n;
  const std::string how = r.gemms ? ": " + std::to_string(r.fused - r.gemms) + " through cuDNN, " +
                                         std::to_string(r.gemms) + " as cuBLASLt GEMMs with the BN folded into the filter"
                                   : " through cuDNN";
  lines.push_back("fused batch norm: " + std::to_string(r.fused) + " of " + std::to_string(r.tried) +
                  " conv patterns run fused" + how + (noted.empty() ? "" : noted + ")") +
                  (r.refused.empty() ? "" : "; the rest run as the plain conv and our BN kernels:"));
  std::vector<bool> done(r.refused.size(), false);
  for (size_t i = 0; i < r.refused.size(); ++i) {
    if (done[i]) continue;
    std::vector<std::string> layers;
    for (size_t j = i; j < r.refused.size(); ++j)
      if (!done[j] && r.refused[j].pattern == r.refused[i].pattern && r.refused[j].why == r.refused[i].why) {
        layers.push_back(r.refused[j].layer);
        done[j] = true;
      }
    std::string names;
    for (size_t k = 0; k < layers.size() && k < 3; ++k) names += (k ? ", " : "") + layers[k];
    if (layers.size() > 3) names += ", ...";
    lines.push_back("  " + std::string(fused_pattern_name(r.refused[i].pattern)) + " not fused for " +
                    std::to_string(layers.size()) + (layers.size() == 1 ? " conv (" : " convs (") + names +
                    "): " + r.refused[i].why);
  }
  return lines;
}
