// core/fileio.h — small checked file helpers for outputs.
#ifndef FC_FILEIO_H
#define FC_FILEIO_H

#include <stddef.h>

#include "check.h"

// Creates a directory and its parents (like mkdir -p). Fails if path exists
// and is not a directory.
int fc_mkdir_p(const char *path, fc_error *e);
// Writes len bytes to path crash-safely: a temporary beside it, fsync, rename.
// On failure nothing is left at path or at the temporary.
int fc_write_file_atomic(const char *path, const void *data, size_t len, fc_error *e);
// The crash-safe write protocol, in three calls:
//   fc_open_tmp    opens "<path>.tmp.<pid>" (its name goes into tmp);
//   fc_commit_tmp  flushes, fsyncs, closes, renames it to path and fsyncs the
//                  directory; on any failure it removes the temporary, sets e;
//   fc_abort_tmp   closes and removes it, when the caller's own writes failed.
#include <stdio.h>
FILE *fc_open_tmp(const char *path, char *tmp, size_t tmp_len, fc_error *e);
int fc_commit_tmp(FILE *fp, const char *tmp, const char *path, fc_error *e);
void fc_abort_tmp(FILE *fp, const char *tmp);
// Makes the entries of directory dir (a rename, an unlink) durable: fsync on
// the directory, best effort (some file systems refuse it).
void fc_fsync_dir(const char *dir);

#endif
