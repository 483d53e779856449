// Rank discovery from each launcher's variables, and the refusals of partial, malformed and
// contradictory sets (dist/launch_env.h), with the environment given as a map.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/errors.h"
#include "dist/launch_env.h"

namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

LaunchInfo discover(const Env& env) { return discover_launch(lookup(env)); }

std::string refusal(const Env& env) {
  try {
    discover(env);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchInfo i = discover({});
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.world, 1);
  EXPECT_EQ(i.local_rank, 0);
  EXPECT_FALSE(i.distributed());
  EXPECT_EQ(i.launcher, "none");
}

TEST(LaunchEnv, EachLaunchersVariables) {
  const struct {
    Env env;
    const char* launcher;
  } cases[] = {
      {{{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"}}, "torchrun or --gpus"},
      {{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}, "mpirun"},
      {{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "3"}}, "srun"},
  };
  for (const auto& c : cases) {
    const LaunchInfo i = discover(c.env);
    EXPECT_EQ(i.rank, 3) << c.launcher;
    EXPECT_EQ(i.world, 8) << c.launcher;
    EXPECT_EQ(i.local_rank, 3) << c.launcher;
    EXPECT_TRUE(i.distributed());
    EXPECT_EQ(i.launcher, c.launcher);
  }
}

TEST(LaunchEnv, LocalRankDiffersFromRankOnSeveralMachines) {
  const LaunchInfo i = discover({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}});
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.local_rank, 1);
}

TEST(LaunchEnv, InnermostLauncherWinsWhenNested) {
  // torchrun started by srun, one task per machine: Slurm counts machines, torchrun counts ranks.
  const LaunchInfo i = discover({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                                 {"RANK", "9"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "1"}});
  EXPECT_EQ(i.launcher, "torchrun or --gpus");
  EXPECT_EQ(i.rank, 9);
  EXPECT_EQ(i.world, 16);
  // mpirun inside a Slurm allocation's batch shell.
  const LaunchInfo m = discover({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"},
                                 {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}});
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(m.rank, 2);
}

TEST(LaunchEnv, AgreeingSetsAreAccepted) {
  const LaunchInfo i = discover({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                 {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(i.rank, 1);
}

TEST(LaunchEnv, ContradictorySetsOfOneWorldAreRefused) {
  // A RANK left exported in a shell, then mpirun: same world size, another rank.
  const std::string why = refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                                   {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_NE(why.find("RANK=0"), std::string::npos) << why;
  EXPECT_NE(why.find("OMPI_COMM_WORLD_RANK=1"), std::string::npos) << why;
  EXPECT_NE(why.find("contradict"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
}

TEST(LaunchEnv, PartialSetsOfTorchrunAndMpirunAreRefused) {
  std::string why = refusal({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(why.find("LOCAL_RANK"), std::string::npos) << why;
  EXPECT_NE(why.find("not"), std::string::npos) << why;
  why = refusal({{"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_NE(why.find("OMPI_COMM_WORLD_RANK"), std::string::npos) << why;
  EXPECT_NE(why.find("OMPI_COMM_WORLD_LOCAL_RANK"), std::string::npos) << why;
  why = refusal({{"LOCAL_RANK", "0"}});
  EXPECT_NE(why.find("RANK and WORLD_SIZE"), std::string::npos) << why;
}

TEST(LaunchEnv, PartialSlurmSetIsIgnored) {
  // Slurm leaves SLURM_PROCID/SLURM_LOCALID in an allocation's shell without SLURM_NTASKS.
  const LaunchInfo i = discover({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}});
  EXPECT_FALSE(i.distributed());
}

TEST(LaunchEnv, MalformedValuesAreRefused) {
  const Env bad[] = {
      {{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
      {{"RANK", "1"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "0"}},
      {{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
      {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}},
      {{"RANK", "1 "}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
      {{"RANK", ""}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
  };
  for (const Env& env : bad) EXPECT_FALSE(refusal(env).empty()) << env.at("RANK") << "/" << env.at("WORLD_SIZE");
}

TEST(LaunchEnv, MasterAddress) {
  MasterAddress a = master_address(lookup({{"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29511"}}));
  EXPECT_EQ(a.host, "node7");
  EXPECT_EQ(a.port, 29511);
  a = master_address(lookup({{"MASTER_ADDR", "10.0.0.1"}}));
  EXPECT_EQ(a.port, 29500);  // torchrun's default
  EXPECT_THROW(master_address(lookup({})), InputError);
  EXPECT_THROW(master_address(lookup({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})), InputError);
  EXPECT_THROW(master_address(lookup({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}})), InputError);
}
