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
            "print" => println!("{}", arg),
            "raw" => {
                // Bytes that are not UTF-8: a lone continuation byte, an invalid lead, a cut sequence.
                std::io::stdout().write_all(b"raw \xff\xfe\xc3 end\n").unwrap();
            }
            "connect" => {
                // A TCP connection to ADDR (ip:port); WASI preview 1 has no way to open one.
                match arg.parse::<std::net::SocketAddr>() {
                    Ok(addr) => match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)) {
                        Ok(_) => println!("connect {} ok", arg),
                        Err(e) => println!("connect {} denied: {}", arg, e),
                    },
                    Err(e) => println!("connect {} bad address: {}", arg, e),
                }
            }
            "resolve" => {
                use std::net::ToSocketAddrs;
                match (arg, 80).to_socket_addrs() {
                    Ok(addrs) => println!("resolve {} ok: {:?}", arg, addrs.collect::<Vec<_>>()),
                    Err(e) => println!("resolve {} denied: {}", arg, e),
                }
            }
            "fill" => {
                // Write up to 256 MiB to the file ARG in 1 MiB blocks; report where a write failed.
                let block = vec![7u8; 1 << 20];
                let mut file = match std::fs::File::create(arg) {
                    Ok(f) => f,
                    Err(e) => {
                        println!("fill denied: {}", e);
                        std::process::exit(1);
                    }
                };
                for written in 0..256 {
                    if let Err(e) = file.write_all(&block) {
                        println!("fill stopped after {} MiB: {}", written, e);
                        std::process::exit(1);
                    }
                }
                println!("fill wrote 256 MiB");
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
