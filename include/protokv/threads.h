#pragma once
// One level of threading at a time: OpenMP for our loops, and OpenBLAS (OpenMP build) shares the
// same pool. set_threads() sets both.
namespace protokv {

void set_threads(int n);  // n <= 0: use all hardware threads
int num_threads();

}  // namespace protokv
