#include <stdio.h>
#include <time.h>
#include <stdint.h>
static inline uint64_t ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
int main(){uint64_t s=0,t0=ns();for(int i=0;i<10000000;i++)s+=ns();uint64_t t1=ns();printf("clock_gettime %.1f ns (%llu)\n",(t1-t0)/1e7,(unsigned long long)(s&1));
volatile uint64_t x=0; t0=ns(); for(int i=0;i<10000000;i++) __atomic_add_fetch(&x,1,__ATOMIC_SEQ_CST); t1=ns(); printf("lock add %.1f ns\n",(t1-t0)/1e7);
FILE*f=fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource","r"); char b[64]={0}; if(f){fgets(b,64,f);} printf("clocksource %s",b); return 0;}
