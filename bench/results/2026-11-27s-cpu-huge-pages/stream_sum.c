#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <immintrin.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct {const float*x; size_t n; double r;} A;
static void* work(void*p){A*a=p; __m512 s0=_mm512_setzero_ps(),s1=s0,s2=s0,s3=s0; size_t i=0;
 for(;i+64<=a->n;i+=64){s0=_mm512_add_ps(s0,_mm512_loadu_ps(a->x+i));s1=_mm512_add_ps(s1,_mm512_loadu_ps(a->x+i+16));s2=_mm512_add_ps(s2,_mm512_loadu_ps(a->x+i+32));s3=_mm512_add_ps(s3,_mm512_loadu_ps(a->x+i+48));}
 a->r=_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0,s1),_mm512_add_ps(s2,s3)));return 0;}
int main(int argc,char**argv){size_t n=1<<24; int huge=atoi(argv[1]); int thr=atoi(argv[2]);
 float*x; if(huge==2){x=malloc(n*4+(2<<20));} else {posix_memalign((void**)&x,2<<20,n*4);}
 if(huge==1) madvise(x,n*4,MADV_HUGEPAGE);
 for(size_t i=0;i<n;i++)x[i]=(float)(i%7);
 double best=1e9, tot=0; for(int r=0;r<40;r++){double t=now(); A a[2]; pthread_t th;
  if(thr==2){a[0]=(A){x,n/2,0};a[1]=(A){x+n/2,n/2,0};pthread_create(&th,0,work,&a[1]);work(&a[0]);pthread_join(th,0);} else {a[0]=(A){x,n,0};work(&a[0]);}
  t=now()-t; if(t<best)best=t; tot+=t;}
 printf("huge=%d threads=%d best %.3f ms (%.1f GB/s) mean %.3f ms\n",huge,thr,best*1e3,n*4/best/1e9,tot/40*1e3);}
