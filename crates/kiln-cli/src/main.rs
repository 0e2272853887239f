//! The `kiln` command. For now one subcommand, `demo`, shows the core API at work: tensors,
//! views, a matrix product, reductions. Training (`kiln train`) and benchmarks (`kiln bench`)
//! join it as they land.

use clap::{Parser, Subcommand};
use kiln::{AllDims, DType, Device, Generator, Tensor};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "kiln: tensors on the CPU and NVIDIA GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Builds tensors, takes views, multiplies and reduces, and prints each step.
    Demo {
        /// Device to run on: cpu, cuda, cuda:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Seed of the random generator.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn demo(device: &Device, seed: u64) -> kiln::Result<()> {
    let mut rng = Generator::new(seed);
    println!(
        "kiln demo on {device} ({} CPU threads)\n",
        kiln::num_threads()
    );

    let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32, device)?.reshape([2, 3])?;
    println!("a = arange(6).reshape(2, 3)\n{a}\n");
    let at = a.t()?;
    println!(
        "a.t() is a view (shares storage: {}, strides {:?})\n{at}\n",
        at.same_storage(&a),
        at.strides()
    );
    let col = a.narrow(1, 1, 2)?;
    println!(
        "a.narrow(1, 1, 2), another view (offset {})\n{col}\n",
        col.layout().offset()
    );

    let x = Tensor::randn([4, 3], 0.0, 1.0, DType::F32, device, &mut rng)?;
    println!("x = randn(4, 3, seed={seed})\n{x}\n");
    let y = x.matmul(&at)?;
    println!(
        "x @ a.t() -> {:?} (the transposed view goes to GEMM as strides)\n{y}\n",
        y.dims()
    );
    println!("relu(x @ a.t()).softmax(-1)\n{}\n", y.relu()?.softmax(-1)?);
    println!("sum over rows: {}", y.sum(0, false)?);
    println!("mean of all:   {}", y.mean(AllDims, false)?);
    println!("argmax per row: {}", y.argmax(-1, false)?);
    let b = a.unsqueeze(0)?.broadcast_as([3, 2, 3])?;
    println!(
        "\na broadcast to {:?} with strides {:?}: sum = {}",
        b.dims(),
        b.strides(),
        b.sum(AllDims, false)?.to_scalar::<f32>()?
    );
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Demo {
        device: "cpu".into(),
        seed: 0,
    }) {
        Command::Demo { device, seed } => Device::parse(&device).and_then(|d| demo(&d, seed)),
    };
    if let Err(e) = result {
        eprintln!("kiln: {e}");
        std::process::exit(1);
    }
}
