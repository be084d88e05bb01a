// core/fileio.c — see fileio.h.
#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fc_mkdir_p(const char *path, fc_error *e) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return fc_fail(e, "%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        int end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return fc_fail(e, "cannot create directory %s: %s", buf, strerror(errno));
            struct stat st;
            if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
                return fc_fail(e, "%s exists and is not a directory", buf);
            if (end) break;
            *p = '/';
        }
    }
    return 0;
}

FILE *fc_open_tmp(const char *path, char *tmp, size_t tmp_len, fc_error *e) {
    if (snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid()) >= (int)tmp_len) {
        fc_fail(e, "%s: path too long", path);
        return NULL;
    }
    FILE *fp = fopen(tmp, "wb");
    if (!fp) fc_fail(e, "cannot write %s: %s", path, strerror(errno));
    return fp;
}

int fc_commit_tmp(FILE *fp, const char *tmp, const char *path, fc_error *e) {
    int bad = ferror(fp) || fflush(fp) != 0 || fsync(fileno(fp)) != 0;
    int err = errno;
    if (fclose(fp) != 0 && !bad) bad = 1, err = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        return fc_fail(e, "cannot write %s: %s", path, strerror(err));
    }
    return 0;
}

int fc_write_file_atomic(const char *path, const void *data, size_t len, fc_error *e) {
    char tmp[4200];
    FILE *fp = fc_open_tmp(path, tmp, sizeof tmp, e);
    if (!fp) return -1;
    if (len && fwrite(data, 1, len, fp) != len) {
        fclose(fp);
        unlink(tmp);
        return fc_fail(e, "cannot write %s: short write", path);
    }
    return fc_commit_tmp(fp, tmp, path, e);
}
