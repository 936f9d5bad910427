//! Compiles the CUDA sources of `kernels/cuda` as host C++ (C++20) against the
//! emulation headers in `include/`, with the grid runner, into one static library.

use std::path::Path;

fn main() {
    let cuda = Path::new("../cuda");
    println!("cargo:rerun-if-changed=../cuda");
    println!("cargo:rerun-if-changed=include");
    println!("cargo:rerun-if-changed=src/grid.cpp");
    println!("cargo:rerun-if-changed=src/grid.h");
    println!("cargo:rerun-if-changed=src/entries.cpp");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .opt_level(2)
        .include("include")
        .include(cuda)
        .flag("-include")
        .flag("cuda_emulation.h")
        .flag("-pthread")
        // The kernels read 16-bit elements through 16-byte vector loads, as CUDA code
        // does; nvcc allows that punning, g++ only without strict aliasing.
        .flag("-fno-strict-aliasing")
        .flag_if_supported("-Wno-unknown-pragmas")
        .warnings(false)
        .file("src/grid.cpp")
        .file("src/entries.cpp");
    let mut sources: Vec<_> = std::fs::read_dir(cuda)
        .expect("kernels/cuda is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    build.files(sources);
    // `.cu` is not a C++ extension the compiler knows.
    build.flag("-x").flag("c++");
    build.compile("tessera_kernels_emulated");
    println!("cargo:rustc-link-lib=stdc++");
}
