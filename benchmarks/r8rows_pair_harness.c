/* r8.c's r8_rows (a group at a time) against r8_pair.c's r8_pair_rows (two groups at once),
 * the kernels alone (no Python, no x quantization): 64 groups of a 512 x 1536 repacked
 * weight (L2), random bytes, 1..8 rows of x in one int8 pass, best of 30 x 20 sweeps of
 * process CPU time; ns per group, sub-block and x row. Build and run from the repo root:
 *
 *   Q=src/inferpath/kernels/csrc/quant; gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c \
 *       -I$Q benchmarks/r8rows_pair_harness.c $Q/r8.c $Q/r8_pair.c $Q/r8_multi.c -o /tmp/r8pair -lm && /tmp/r8pair 0 && /tmp/r8pair 1
 * (argument 0: Q4_K, 1: Q6_K)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "r8.h"
static double now(){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int qtype = atoi(argv[1]) ? Q6_K_R8 : Q4_K_R8; int64_t k=1536, nsb=k/256, gb = nsb*(qtype==Q4_K_R8?Q4_K_R8_BYTES:Q6_K_R8_BYTES);
  int G=64; uint8_t *w=aligned_alloc(64,G*gb); for(int64_t i=0;i<G*gb;i++) w[i]=rand(); 
  for(int g=0;g<G;g++) for(int t=0;t<nsb;t++){ uint8_t*o=w+g*gb+t*(gb/nsb); for(int r=0;r<16;r++){o[2*r+1]=0x20;} }
  int8_t *q=malloc(8*k), *rr=calloc(8*k,1); float *d=malloc(8*k/32*4), *s=malloc(8*k/32*4), *h=malloc(8*k/16*4);
  for(int i=0;i<8*k;i++) q[i]=rand()%200-100; for(int i=0;i<8*k/32;i++){d[i]=0.01f;s[i]=0.3f;} for(int i=0;i<8*k/16;i++)h[i]=0.1f;
  float out[256];
  for(int rows=1;rows<=8;rows++){
    q8_rows x={q,rr,d,s,h,k,rows==1?1:8,1};
    double best1=1e9,best2=1e9;
    for(int rep=0;rep<30;rep++){
      double t0=now(); for(int it=0;it<20;it++) for(int g=0;g<G;g++) r8_rows(qtype,w+g*gb,&x,rows,out); double t1=now()-t0;
      t0=now(); for(int it=0;it<20;it++) for(int g=0;g<G;g+=2) r8_pair_rows(qtype,w+g*gb,gb,&x,rows,out); double t2=now()-t0;
      if(t1<best1)best1=t1; if(t2<best2)best2=t2; }
    double macs=20.0*G*8*k*rows;
    printf("qtype %d rows %d: r8_rows %.2f ns/subblock-row  pair %.2f  (pair/r8 %.2f) GMAC/s %.1f vs %.1f\n", qtype, rows,
      best1/(20.0*G*nsb*8*rows)*1e9, best2/(20.0*G*nsb*8*rows)*1e9, best2/best1, macs/best1/1e9, macs/best2/1e9);
  }
}
