// Who this process is among the ranks of a data-parallel run: rank, world size and local rank, read
// from the variables the common launchers set, and where the ranks meet (MASTER_ADDR:MASTER_PORT).
//
//   torchrun (and bin/train --gpus N)   RANK, WORLD_SIZE, LOCAL_RANK
//   Open MPI's mpirun                   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   Slurm's srun                        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//
// Launchers nest (torchrun started by srun on each node, mpirun inside a Slurm allocation), so the
// innermost one's variables win: torchrun's, then Open MPI's, then Slurm's. Two complete sets that
// describe the same world (same size) but give this process different ranks contradict each other
// (typically a RANK left exported in a shell) and are refused. torchrun and mpirun always set all
// three of theirs, so a partial set of those is refused too; Slurm leaves some of its variables in
// any shell of an allocation, so a partial Slurm set is ignored. Pure: the environment comes in as a
// lookup function, so every case is tested without touching the process's own.
#pragma once

#include <functional>
#include <string>

// A lookup of one environment variable: its value, or nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

struct LaunchInfo {
  int rank = 0, world = 1, local_rank = 0;
  std::string launcher = "none";  // "torchrun or --gpus", "mpirun", "srun" or "none" (one process)
  bool distributed() const { return world > 1; }
  bool is_root() const { return rank == 0; }
};

// Throws InputError (one line naming the variables) for a partial, malformed or contradictory set.
LaunchInfo discover_launch(const EnvLookup& env);
// The process's own environment.
LaunchInfo discover_launch();

// Where rank 0 listens: MASTER_ADDR (required with more than one rank) and MASTER_PORT (torchrun's
// default, 29500, when unset).
struct MasterAddress {
  std::string host;
  int port = 29500;
};
MasterAddress master_address(const EnvLookup& env);
