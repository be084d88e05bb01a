// core/sha256.h — SHA-256 (OpenSSL libcrypto) as 64 lowercase hex digits:
// what a checkpoint's manifest records of every file.
#ifndef FC_SHA256_H
#define FC_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "hd.h"

FC_BEGIN_DECLS

void fc_sha256_mem(const void *data, size_t n, char hex[65]);
// The file at path; *size is its length in bytes.
int fc_sha256_file(const char *path, uint64_t *size, char hex[65], fc_error *e);
// Everything left in the open fp (path names it in messages), counting the
// bytes: to hash exactly the file one has open.
int fc_sha256_fp(FILE *fp, const char *path, uint64_t *size, char hex[65], fc_error *e);

FC_END_DECLS

#endif
