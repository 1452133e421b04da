#include <stdio.h>
int next_probe(void);
int main(void) {
    printf("next=%d\n", next_probe());
    return 0;
}
