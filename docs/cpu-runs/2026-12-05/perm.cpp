// Throughput of the AVX-512 word permutes and widenings on one core: 12 independent chains of each
// instruction (results.txt, item 3). g++ -O2 -mavx512bw -mavx512f perm.cpp -o perm && ./perm
#include <chrono>
#include <cstdio>
#include <immintrin.h>
#define N 12
template<int K> __attribute__((noinline)) __m512i run(long it, __m512i idx, __m512i b) {
  __m512i a[N]; for(int i=0;i<N;++i) a[i]=_mm512_set1_epi32(i);
  for(long i=0;i<it;++i){
#pragma GCC unroll 16
    for(int k=0;k<N;++k){
      if (K==0) a[k]=_mm512_maskz_permutex2var_epi16(0xAAAAAAAAu, a[k], idx, b);
      if (K==1) a[k]=_mm512_permutexvar_epi16(idx, a[k]);
      if (K==2) a[k]=_mm512_shuffle_epi8(a[k], idx);
      if (K==3) a[k]=_mm512_cvtepu16_epi32(_mm512_castsi512_si256(a[k]));
      if (K==4) a[k]=_mm512_slli_epi32(a[k], 1);
      if (K==5) a[k]=_mm512_permutexvar_epi32(idx, a[k]);
    }
  }
  __m512i r=a[0]; for(int k=1;k<N;++k) r=_mm512_xor_si512(r,a[k]); return r;
}
template<int K> void t(const char* name){ long it=20000000; __m512i idx=_mm512_set1_epi16(3), b=_mm512_set1_epi16(7);
  auto t0=std::chrono::steady_clock::now(); __m512i r=run<K>(it,idx,b); double s=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  printf("%-14s %.2f ns per op (%.2f per ns) %d\n", name, s/(double(N)*it)*1e9, double(N)*it/s*1e-9, _mm512_reduce_add_epi32(r)); }
int main(){ for(int r=0;r<2;++r){ t<0>("vpermt2w"); t<1>("vpermw"); t<2>("vpshufb"); t<3>("vpmovzxwd"); t<4>("vpslld"); t<5>("vpermd"); } }
