// reference/ckpt_reference.h — the reference's checkpoint save and load
// (DESIGN §6), for the FSDP engine and for the one-process `local` trainer,
// on top of core/checkpoint.h.
#ifndef FC_CKPT_REFERENCE_H
#define FC_CKPT_REFERENCE_H

#include "checkpoint.h"
#include "fsdp.h"
#include "local.h"

// Collective over the engine's communicator. cfg is the config f was created with.
int fc_fsdp_ckpt_save(fc_fsdp *f, const fc_run_config *cfg, const char *dir, fc_state_dict kind, fc_error *e);
// Verifies dir (rank 0 checks every SHA-256), then every rank reads only the
// elements it stores. A refused checkpoint changes nothing; a read that fails
// after verification (an I/O error) leaves the state undefined, and the
// caller must destroy the engine.
int fc_fsdp_ckpt_load(fc_fsdp *f, const fc_run_config *cfg, const char *dir, fc_error *e);

int fc_local_ckpt_save(fc_local *L, const char *dir, fc_state_dict kind, fc_error *e);
int fc_local_ckpt_load(fc_local *L, const char *dir, fc_error *e);

#endif
