// core/fileio.h — small checked file helpers: whole small inputs read with a
// limit, outputs written crash-safely.
#ifndef FC_FILEIO_H
#define FC_FILEIO_H

#include <stddef.h>

#include "check.h"

// How fc_read_file_limited failed, for a caller that words one refusal its
// own way (e holds the common wording either way).
enum { FC_READ_CANNOT_OPEN = -1, FC_READ_TOO_LARGE = -2, FC_READ_FAILED = -3 };

// Reads a whole small file (a config, a manifest, trace.json) of at most limit
// bytes into *out, NUL-terminated (free it), *len bytes before the NUL. A
// regular file is refused by its size before a byte is read; a pipe
// (`--model <(...)`) has none and is read until one byte past the limit.
// On failure *out is NULL and e holds one line:
//   FC_READ_CANNOT_OPEN  "<path>: cannot open: <reason>" (errno kept: ENOENT
//                        is a missing file)
//   FC_READ_TOO_LARGE    "<path>: larger than <limit> bytes"
//   FC_READ_FAILED       "<path>: read error", or for a regular file that
//                        grew or shrank meanwhile "<path>: changed size while being read"
int fc_read_file_limited(const char *path, size_t limit, char **out, size_t *len, fc_error *e);

// Creates a directory and its parents (like mkdir -p). Fails if path exists
// and is not a directory.
int fc_mkdir_p(const char *path, fc_error *e);
// Writes len bytes to path crash-safely: a temporary beside it, fsync, rename.
// On failure nothing is left at path or at the temporary.
int fc_write_file_atomic(const char *path, const void *data, size_t len, fc_error *e);
// The crash-safe write protocol, in three calls:
//   fc_open_tmp    opens "<path>.tmp.<pid>" (its name goes into tmp);
//   fc_commit_tmp  flushes, (FC_DURABLE) fsyncs, closes, renames it to path and
//                  (FC_DURABLE) fsyncs the directory; on any failure it removes
//                  the temporary, sets e;
//   fc_abort_tmp   closes and removes it, when the caller's own writes failed.
#include <stdio.h>
#include "hd.h"

FC_BEGIN_DECLS
// What a committed file survives.
//   FC_DURABLE  a crash of the machine too: the file and its directory entry are
//               fsynced (checkpoints, their manifests, reports, trace.json);
//   FC_ATOMIC   a crash of the process: the rename alone, so no partial file ever
//               has the name; after a crash of the machine the file may be short or
//               empty, and every reader refuses such a file (core/safetensors.h).
//               For the traces' tensor files: a run's evidence, made again by
//               running again, and gigabytes a step at real scale, where an fsync
//               also waits for the dirty pages of what ran before it
//               (docs/measurements/fileio.md).
typedef enum { FC_DURABLE, FC_ATOMIC } fc_commit_kind;
FILE *fc_open_tmp(const char *path, char *tmp, size_t tmp_len, fc_error *e);
int fc_commit_tmp(FILE *fp, const char *tmp, const char *path, fc_commit_kind kind, fc_error *e);
void fc_abort_tmp(FILE *fp, const char *tmp);
// Makes the entries of directory dir (a rename, an unlink) durable: fsync on
// the directory, best effort (some file systems refuse it).
void fc_fsync_dir(const char *dir);

FC_END_DECLS

#endif
