// A WASI command used by the containment tests: each argument pair is an action run in order.
// Build: rustc --edition 2021 --target wasm32-wasi -O probe.rs
use std::io::{Read, Write};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let (op, arg) = (args[i].as_str(), args.get(i + 1).map(String::as_str).unwrap_or(""));
        i += 2;
        match op {
            "read" => match std::fs::read_to_string(arg) {
                Ok(text) => println!("read ok {} bytes: {}", text.len(), text.trim()),
                Err(e) => println!("read denied: {}", e),
            },
            "write" => match std::fs::write(arg, b"written by guest") {
                Ok(()) => println!("write ok"),
                Err(e) => println!("write denied: {}", e),
            },
            "list" => match std::fs::read_dir(arg) {
                Ok(entries) => {
                    let mut names: Vec<String> =
                        entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                    names.sort();
                    println!("list ok: {}", names.join(","));
                }
                Err(e) => println!("list denied: {}", e),
            },
            "env" => {
                let mut vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{}={}", k, v)).collect();
                vars.sort();
                println!("env: {}", vars.join(" "));
            }
            "stdin" => {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s).unwrap();
                println!("stdin: {}", s);
            }
            "alloc" => {
                // Grow a vector by 1 MiB steps up to `arg` MiB, touching every page.
                let mb: usize = arg.parse().unwrap();
                let mut blocks: Vec<Vec<u8>> = Vec::new();
                for n in 0..mb {
                    blocks.push(vec![n as u8; 1 << 20]);
                }
                println!("alloc ok {} MiB", blocks.len());
            }
            "spin" => {
                let mut x: u64 = 0;
                loop {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    if x == 42 {
                        break;
                    }
                }
                println!("{}", x);
            }
            "sleep" => std::thread::sleep(std::time::Duration::from_secs(arg.parse().unwrap())),
            "flood" => {
                let line = [b'x'; 1023];
                let out = std::io::stdout();
                let mut out = out.lock();
                loop {
                    out.write_all(&line).unwrap();
                    out.write_all(b"\n").unwrap();
                }
            }
            "fill" => {
                // Write 1 MiB blocks to `arg` (up to 256 MiB); report how far it got.
                let block = vec![7u8; 1 << 20];
                let mut file = std::fs::File::create(arg).unwrap();
                let mut written = 0;
                while written < 256 {
                    if let Err(e) = file.write_all(&block) {
                        println!("fill stopped after {} MiB: {}", written, e);
                        std::process::exit(1);
                    }
                    written += 1;
                }
                println!("fill wrote {} MiB", written);
            }
            "files" => {
                // Create up to 50000 files of 4 KiB in directory `arg`; report how many.
                let block = [1u8; 4096];
                for n in 0..50000 {
                    if let Err(e) = std::fs::write(format!("{}/f{}", arg, n), &block[..]) {
                        println!("files stopped after {}: {}", n, e);
                        std::process::exit(1);
                    }
                }
                println!("files wrote 50000");
            }
            "exit" => std::process::exit(arg.parse().unwrap()),
            other => {
                eprintln!("unknown op {}", other);
                std::process::exit(64);
            }
        }
    }
}
