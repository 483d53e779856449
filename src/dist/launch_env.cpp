// Rank discovery from the launchers' variables (launch_env.h).
#include "dist/launch_env.h"

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <vector>

#include "core/errors.h"

namespace {

struct VariableSet {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
  bool partial_is_error;  // Slurm leaves some of its variables in any shell of an allocation
};

// Innermost launcher first.
const VariableSet kSets[] = {
    {"torchrun or --gpus", "RANK", "WORLD_SIZE", "LOCAL_RANK", true},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", true},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", false},
};

int parse_count(const char* name, const char* value, long lo) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < lo || v > 1000000)
    throw InputError(std::string(name) + "='" + value + "' is not a " + (lo > 0 ? "positive" : "non-negative") +
                     " integer");
  return static_cast<int>(v);
}

// The set's values when all three are present; nothing when none is (or a partial Slurm set).
std::optional<LaunchInfo> read_set(const VariableSet& s, const EnvLookup& env) {
  const char* r = env(s.rank);
  const char* w = env(s.world);
  const char* l = env(s.local_rank);
  const int present = (r != nullptr) + (w != nullptr) + (l != nullptr);
  if (present == 0) return std::nullopt;
  if (present < 3) {
    if (!s.partial_is_error) return std::nullopt;
    std::string have, missing;
    for (const char* name : {s.rank, s.world, s.local_rank}) {
      std::string& list = env(name) ? have : missing;
      list += (list.empty() ? "" : " and ") + std::string(name);
    }
    throw InputError(have + (have.find(" and ") != std::string::npos ? " are" : " is") + " set but " + missing +
                     " not: " + s.launcher + " sets all three of " + s.rank + ", " + s.world + ", " +
                     s.local_rank + "; set them all, or unset them for a single process");
  }
  LaunchInfo info;
  info.launcher = s.launcher;
  info.world = parse_count(s.world, w, 1);
  info.rank = parse_count(s.rank, r, 0);
  info.local_rank = parse_count(s.local_rank, l, 0);
  if (info.rank >= info.world)
    throw InputError(std::string(s.rank) + "=" + r + " is not below " + s.world + "=" + w);
  if (info.local_rank >= info.world)
    throw InputError(std::string(s.local_rank) + "=" + l + " is not below " + s.world + "=" + w);
  return info;
}

}  // namespace

LaunchInfo discover_launch(const EnvLookup& env) {
  std::vector<std::pair<const VariableSet*, LaunchInfo>> found;
  for (const VariableSet& s : kSets)
    if (auto info = read_set(s, env)) found.emplace_back(&s, *info);
  if (found.empty()) return LaunchInfo{};
  const auto& [chosen_set, chosen] = found.front();
  for (size_t i = 1; i < found.size(); ++i) {
    const auto& [other_set, other] = found[i];
    if (other.world != chosen.world) continue;  // a launcher nested in another: the inner one counts
    if (other.rank != chosen.rank || other.local_rank != chosen.local_rank)
      throw InputError(std::string(chosen_set->rank) + "=" + std::to_string(chosen.rank) + " and " +
                       other_set->rank + "=" + std::to_string(other.rank) + " (" + chosen_set->local_rank + "=" +
                       std::to_string(chosen.local_rank) + ", " + other_set->local_rank + "=" +
                       std::to_string(other.local_rank) + ") contradict each other in a world of " +
                       std::to_string(chosen.world) + " ranks: unset the variables of the launcher you are not using");
  }
  return chosen;
}

LaunchInfo discover_launch() {
  return discover_launch([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

MasterAddress master_address(const EnvLookup& env) {
  MasterAddress a;
  const char* host = env("MASTER_ADDR");
  if (!host || !*host)
    throw InputError("MASTER_ADDR is not set: with more than one rank, every rank needs the address of rank 0's "
                     "machine (and MASTER_PORT, default 29500) to meet there");
  a.host = host;
  if (const char* port = env("MASTER_PORT")) {
    a.port = parse_count("MASTER_PORT", port, 1);
    if (a.port > 65535) throw InputError(std::string("MASTER_PORT='") + port + "' is not a TCP port (1-65535)");
  }
  return a;
}
