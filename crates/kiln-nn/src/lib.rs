//! Neural-network building blocks on top of kiln's tensors and autodiff: modules and layers,
//! losses, initialisers, optimizers and learning-rate schedules, safetensors checkpoints, and
//! an MNIST-format data loader. Nothing here touches a backend: it is all tensor ops.

pub mod checkpoint;
pub mod conv;
pub mod data;
pub mod fit;
pub mod init;
pub mod layers;
pub mod loss;
pub mod optim;
pub mod parallel;

pub use conv::{AvgPool2d, BatchNorm2d, Conv2d, Flatten, MaxPool2d, Unflatten};
pub use layers::{Activation, Dropout, Linear, Module, Sequential};
