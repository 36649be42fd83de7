/*
 * check.h - the assertion of the standalone C tests: unlike assert(), it stays on in every
 * build, and a failure names the file, the line and the expression, then exits 1.
 */
#ifndef RB_TEST_CHECK_H
#define RB_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x);                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
