//! Launch: start the compiled program on its arguments, from the calling thread or on the CPU launcher thread
//! (one enum, two paths), and give each target its value (a device value, or its shards on a mesh).

use std::sync::Arc;

use lazuli_hlo::Loc;
use lazuli_pjrt::{Buffer, LoadedExecutable};

use super::in_flight::{self, Launched};
use super::plan::Plan;
use super::upload::Upload;
use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::{Error, Result};
use crate::graph::tensor::Data;
use crate::runtime::launcher::{self, Arg, Job, Ticket};
use crate::runtime::value::DeviceValue;
use crate::runtime::{Backend, Runtime};

/// Where a program runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Launch {
    /// On lazuli's launcher thread: single-device CPU programs of a thread that has not read a result of its latest
    /// program since launching it (`Config::cpu_launcher`); host data is uploaded there too.
    OnLauncher,
    /// From the calling thread.
    Here,
}

impl Launch {
    pub fn choose(rt: &Runtime, plan: &Plan) -> Launch {
        if plan.mesh.is_none() && rt.uses_launcher(launcher::take_demand()) {
            Launch::OnLauncher
        } else {
            Launch::Here
        }
    }

    /// How host data goes to the device for this launch.
    pub fn upload(self, rt: &Runtime) -> Upload {
        match self {
            Launch::OnLauncher => Upload::OnLauncher,
            Launch::Here => Upload::Now { reuse: rt.config.backend == Backend::Cpu },
        }
    }

    /// Start `exe` on `args` (one list per device); the targets' values in output order (then a checked
    /// program's counts of non-finite values, `exec/finite/`). At most
    /// `in_flight::MAX_IN_FLIGHT` programs are in flight: older ones are waited for (and their errors reported)
    /// first.
    pub fn run(
        self,
        rt: &'static Runtime,
        plan: &Plan,
        exe: &Arc<LoadedExecutable>,
        mut args: Vec<Vec<Arg>>,
        at: Loc,
    ) -> Result<Vec<Data>> {
        let n_out = exe.num_outputs().map_err(|source| Error::Execute { at, source })?;
        let expected = plan.walk.targets.len() + plan.checked as usize;
        if n_out != expected {
            return Err(Error::Internal(format!("the program has {n_out} outputs, {expected} expected")));
        }
        in_flight::throttle(in_flight::MAX_IN_FLIGHT - 1)?;
        let program = launcher::next_program();
        Counters::add(&COUNTERS.executions, 1);
        match self {
            Launch::OnLauncher => {
                let outputs: Vec<Arc<DeviceValue>> = (0..n_out).map(|_| DeviceValue::pending(program)).collect();
                let ticket = Ticket::new(at);
                let args = args.pop().unwrap_or_default();
                let from_core = launcher::cores::current();
                let job = Job { exe: exe.clone(), args, outputs: outputs.clone(), ticket: ticket.clone(), from_core };
                launcher::submit(rt, job);
                in_flight::push(Launched::Queued(ticket));
                Counters::add(&COUNTERS.queued, 1);
                Ok(outputs.into_iter().map(Data::Device).collect())
            }
            Launch::Here => {
                let outs = launch_here(plan, exe, &args, n_out, at)?;
                Ok(outs
                    .into_iter()
                    .enumerate()
                    .map(|(j, mut bufs)| match &plan.mesh {
                        Some(placement) => Data::Sharded {
                            shards: bufs.into_iter().map(Arc::new).collect(),
                            sharding: placement.outputs[j].clone(),
                        },
                        None => Data::Device(DeviceValue::ready(bufs.remove(0), program)),
                    })
                    .collect())
            }
        }
    }
}

/// Launch from this thread; output j's buffer on each device.
fn launch_here(
    plan: &Plan,
    exe: &LoadedExecutable,
    args: &[Vec<Arg>],
    n_out: usize,
    at: Loc,
) -> Result<Vec<Vec<Buffer>>> {
    let devices = plan.devices();
    let mut inputs: Vec<Vec<&Buffer>> = Vec::with_capacity(devices);
    for list in args {
        inputs.push(list.iter().map(Arg::buffer).collect::<Result<_>>()?);
    }
    let (mut per_device, done) = exe.launch_sharded(&inputs).map_err(|source| Error::Execute { at, source })?;
    let mut outs: Vec<Vec<Buffer>> = (0..n_out).map(|_| Vec::with_capacity(devices)).collect();
    for list in per_device.iter_mut() {
        for (j, b) in list.drain(..).enumerate() {
            outs[j].push(b);
        }
    }
    if outs.iter().any(|bufs| bufs.len() != devices) {
        return Err(Error::Internal("the program returned fewer outputs than it has".into()));
    }
    // Buffers dropped while the program runs are freed by the plugin once it no longer uses them (PJRT's contract
    // for destroying a buffer), so only the completion is kept.
    in_flight::push(Launched::Here { done, at });
    Ok(outs)
}
