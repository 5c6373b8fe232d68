//! What wasmtime itself charges for one call into a module, with nothing of ours around
//! it: a function adding one to its argument, called `--calls` times synchronously
//! (`TypedFunc::call`) and asynchronously (`call_async`, on a fiber, as the filters' host
//! calls so that a callback past its tick can yield its thread). The floor under every
//! callback the host makes.
//!
//!     cargo run --release -p switchyard-filters --example call_floor -- [CALLS]

use std::time::Instant;

use wasmtime::{Config, Engine, Instance, Module, Store};

const ADD_ONE: &str = r#"(module (func (export "f") (param i32) (result i32)
    local.get 0 i32.const 1 i32.add))"#;

fn main() -> anyhow::Result<()> {
    let calls: u32 = std::env::args().nth(1).map_or(Ok(200_000), |n| n.parse())?;
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    for on_fiber in [false, true] {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config)?;
        let module = Module::new(&engine, ADD_ONE)?;
        let mut store = Store::new(&engine, ());
        let instance = match on_fiber {
            true => runtime.block_on(Instance::new_async(&mut store, &module, &[]))?,
            false => Instance::new(&mut store, &module, &[])?,
        };
        let add_one = instance.get_typed_func::<i32, i32>(&mut store, "f")?;
        let started = Instant::now();
        runtime.block_on(async {
            for n in 0..calls as i32 {
                store.set_epoch_deadline(1_000_000);
                let answer = match on_fiber {
                    true => add_one.call_async(&mut store, n).await?,
                    false => add_one.call(&mut store, n)?,
                };
                anyhow::ensure!(answer == n + 1, "{n} + 1 = {answer}?");
            }
            Ok(())
        })?;
        let per_call = started.elapsed().as_nanos() as f64 / f64::from(calls);
        let how = if on_fiber {
            "call_async (fiber)"
        } else {
            "call (synchronous)"
        };
        println!("{how}: {per_call:.0} ns a call");
    }
    Ok(())
}
