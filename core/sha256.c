// core/sha256.c — see sha256.h. OpenSSL's EVP interface; its failures are
// internal (out of memory), so they exit rather than return.
#include "sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

static EVP_MD_CTX *sha_begin(void) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: OpenSSL cannot start a SHA-256 digest", __FILE__, __LINE__);
    return ctx;
}

static void sha_update(EVP_MD_CTX *ctx, const void *p, size_t n) {
    if (n && EVP_DigestUpdate(ctx, p, n) != 1)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: OpenSSL SHA-256 update failed", __FILE__, __LINE__);
}

static void sha_end(EVP_MD_CTX *ctx, char hex[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx, md, &len) != 1 || len != 32)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: OpenSSL SHA-256 final failed", __FILE__, __LINE__);
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

void fc_sha256_mem(const void *data, size_t n, char hex[65]) {
    EVP_MD_CTX *ctx = sha_begin();
    sha_update(ctx, data, n);
    sha_end(ctx, hex);
}

int fc_sha256_fp(FILE *fp, const char *path, uint64_t *size, char hex[65], fc_error *e) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = mallocCheck(CHUNK);
    EVP_MD_CTX *ctx = sha_begin();
    uint64_t total = 0;
    size_t k;
    while ((k = fread(buf, 1, CHUNK, fp)) > 0) {
        sha_update(ctx, buf, k);
        total += k;
    }
    int bad = ferror(fp);
    sha_end(ctx, hex);
    free(buf);
    if (bad) return fc_fail(e, "%s: read error while computing its SHA-256", path);
    *size = total;
    return 0;
}

int fc_sha256_file(const char *path, uint64_t *size, char hex[65], fc_error *e) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return fc_fail(e, "%s: cannot open: %s", path, strerror(errno));
    int rc = fc_sha256_fp(fp, path, size, hex, e);
    fclose(fp);
    return rc;
}
