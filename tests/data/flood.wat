(module
  ;; Writes 4 KiB to stdout forever, exiting like a libc program once a write fails.
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 4096))
    (loop $l
      (if (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))
        (then (call $proc_exit (i32.const 120))))
      (br $l))))
